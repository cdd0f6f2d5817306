// ringmaster.v1.RendezvousService over the Coordinator. Wait parks its reactor until the keys are
// set, the wait times out, or the job ends; it never blocks a thread.
#pragma once

#include "coordinator/coordinator.h"
#include "ringmaster/v1/rendezvous.grpc.pb.h"

namespace ringmaster {

class RendezvousService final : public v1::RendezvousService::CallbackService {
 public:
  // `coordinator` is borrowed and must outlive the service.
  explicit RendezvousService(Coordinator& coordinator) : coordinator_(coordinator) {}

  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* context, const v1::SetRequest* request,
                                v1::SetResponse* response) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* context, const v1::GetRequest* request,
                                v1::GetResponse* response) override;
  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* context,
                                 const v1::WaitRequest* request,
                                 v1::WaitResponse* response) override;

 private:
  Coordinator& coordinator_;
};

}  // namespace ringmaster
