// ringmaster.v1.WorkerService over the Coordinator: worker registration and the per-worker Session
// stream, whose reactor is the coordinator's WorkerChannel to that worker.
#pragma once

#include "coordinator/coordinator.h"
#include "ringmaster/v1/worker.grpc.pb.h"

namespace ringmaster {

class WorkerService final : public v1::WorkerService::CallbackService {
 public:
  // `coordinator` is borrowed and must outlive the service.
  explicit WorkerService(Coordinator& coordinator) : coordinator_(coordinator) {}

  grpc::ServerUnaryReactor* RegisterWorker(grpc::CallbackServerContext* context,
                                           const v1::RegisterWorkerRequest* request,
                                           v1::RegisterWorkerResponse* response) override;
  grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage>* Session(
      grpc::CallbackServerContext* context) override;

 private:
  Coordinator& coordinator_;
};

}  // namespace ringmaster
