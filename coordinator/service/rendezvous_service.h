// ringmaster.v1.RendezvousService over the Coordinator. Wait parks its reactor until the keys are
// set, the wait times out, or the job ends; it never blocks a thread.
#pragma once

#include "common/executor.h"
#include "coordinator/coordinator.h"
#include "coordinator/service/auth.h"
#include "ringmaster/v1/rendezvous.grpc.pb.h"

namespace ringmaster {

class RendezvousService final : public v1::RendezvousService::CallbackService {
 public:
  // `coordinator` is borrowed and must outlive the service; so is `auth` (null: nobody
  // authenticates). A call must come from an authenticated caller and carry the job epoch's
  // rendezvous token (metadata kRendezvousTokenMetadata), which only the job's workers receive.
  // `io` (borrowed; null: Executor::Inline()) does the file I/O of the job's code going out and
  // the ranks' output coming in.
  explicit RendezvousService(Coordinator& coordinator, const Authenticator* auth = nullptr,
                             Executor* io = nullptr)
      : coordinator_(coordinator),
        auth_(auth != nullptr ? *auth : kNoAuthentication),
        io_(io != nullptr ? *io : Executor::Inline()) {}

  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* context, const v1::SetRequest* request,
                                v1::SetResponse* response) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* context, const v1::GetRequest* request,
                                v1::GetResponse* response) override;
  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* context,
                                 const v1::WaitRequest* request,
                                 v1::WaitResponse* response) override;
  grpc::ServerWriteReactor<v1::GetJobSourceResponse>* GetJobSource(
      grpc::CallbackServerContext* context, const v1::GetJobSourceRequest* request) override;
  grpc::ServerReadReactor<v1::PutRankOutputRequest>* PutRankOutput(
      grpc::CallbackServerContext* context, v1::PutRankOutputResponse* response) override;

 private:
  static const Authenticator kNoAuthentication;

  // The caller authenticated: its rendezvous token (checked with the job's scope), or the error.
  absl::StatusOr<std::string> Authorize(const grpc::CallbackServerContext& context) const;

  Coordinator& coordinator_;
  const Authenticator& auth_;
  Executor& io_;
};

}  // namespace ringmaster
