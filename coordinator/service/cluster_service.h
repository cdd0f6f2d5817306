// ringmaster.v1.ClusterService over the Coordinator: the worker daemons it knows, for operators.
#pragma once

#include "coordinator/coordinator.h"
#include "coordinator/service/auth.h"
#include "ringmaster/v1/cluster.grpc.pb.h"

namespace ringmaster {

class ClusterService final : public v1::ClusterService::CallbackService {
 public:
  // `coordinator` is borrowed and must outlive the service.
  // `auth` (borrowed; null: nobody authenticates): any authenticated caller may list workers.
  explicit ClusterService(Coordinator& coordinator, const Authenticator* auth = nullptr)
      : coordinator_(coordinator), auth_(auth != nullptr ? *auth : kNoAuthentication) {}

  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* context,
                                        const v1::ListWorkersRequest* request,
                                        v1::ListWorkersResponse* response) override;

 private:
  static const Authenticator kNoAuthentication;

  Coordinator& coordinator_;
  const Authenticator& auth_;
};

}  // namespace ringmaster
