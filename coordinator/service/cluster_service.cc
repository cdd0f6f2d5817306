#include "coordinator/service/cluster_service.h"

#include <algorithm>
#include <tuple>
#include <vector>

#include "coordinator/service/proto_convert.h"

namespace ringmaster {

grpc::ServerUnaryReactor* ClusterService::ListWorkers(grpc::CallbackServerContext* context,
                                                      const v1::ListWorkersRequest* request,
                                                      v1::ListWorkersResponse* response) {
  std::vector<Worker> workers = coordinator_.ListWorkers();
  std::sort(workers.begin(), workers.end(), [](const Worker& a, const Worker& b) {
    return std::tie(a.host, a.device, a.id) < std::tie(b.host, b.device, b.id);
  });
  for (const Worker& w : workers) ToProto(w, response->add_workers());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace ringmaster
