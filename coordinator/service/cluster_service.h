// ringmaster.v1.ClusterService over the Coordinator: the worker daemons it knows, for operators.
#pragma once

#include "coordinator/coordinator.h"
#include "ringmaster/v1/cluster.grpc.pb.h"

namespace ringmaster {

class ClusterService final : public v1::ClusterService::CallbackService {
 public:
  // `coordinator` is borrowed and must outlive the service.
  explicit ClusterService(Coordinator& coordinator) : coordinator_(coordinator) {}

  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* context,
                                        const v1::ListWorkersRequest* request,
                                        v1::ListWorkersResponse* response) override;

 private:
  Coordinator& coordinator_;
};

}  // namespace ringmaster
