// ringmaster.v1.RendezvousService over the Coordinator. Wait parks its reactor until the keys are
// set, the wait times out, or the job ends; it never blocks a thread.
#pragma once

#include "coordinator/coordinator.h"
#include "coordinator/service/auth.h"
#include "ringmaster/v1/rendezvous.grpc.pb.h"

namespace ringmaster {

class RendezvousService final : public v1::RendezvousService::CallbackService {
 public:
  // `coordinator` is borrowed and must outlive the service; so is `auth` (null: nobody
  // authenticates). A call must come from an authenticated caller and carry the job epoch's
  // rendezvous token (metadata kRendezvousTokenMetadata), which only the job's workers receive.
  explicit RendezvousService(Coordinator& coordinator, const Authenticator* auth = nullptr)
      : coordinator_(coordinator), auth_(auth != nullptr ? *auth : kNoAuthentication) {}

  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* context, const v1::SetRequest* request,
                                v1::SetResponse* response) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* context, const v1::GetRequest* request,
                                v1::GetResponse* response) override;
  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* context,
                                 const v1::WaitRequest* request,
                                 v1::WaitResponse* response) override;

 private:
  static const Authenticator kNoAuthentication;

  // The caller authenticated: its rendezvous token (checked with the job's scope), or the error.
  absl::StatusOr<std::string> Authorize(const grpc::CallbackServerContext& context) const;

  Coordinator& coordinator_;
  const Authenticator& auth_;
};

}  // namespace ringmaster
