#include "coordinator/service/cluster_service.h"

#include <algorithm>
#include <tuple>
#include <vector>

#include "coordinator/service/grpc_status.h"
#include "coordinator/service/proto_convert.h"

namespace ringmaster {

const Authenticator ClusterService::kNoAuthentication;

grpc::ServerUnaryReactor* ClusterService::ListWorkers(grpc::CallbackServerContext* context,
                                                      const v1::ListWorkersRequest* request,
                                                      v1::ListWorkersResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<Principal> caller = auth_.Authenticate(*context);
  if (!caller.ok()) {
    reactor->Finish(ToGrpcStatus(caller.status()));
    return reactor;
  }
  std::vector<Worker> workers = coordinator_.ListWorkers();
  // Which job a busy worker serves is its owner's business (and an admin's): others see it busy.
  if (!caller->admin) {
    for (Worker& w : workers) {
      if (w.job_id.empty()) continue;
      absl::StatusOr<Job> job = coordinator_.GetJob(w.job_id);
      if (job.ok() && !caller->worker && job->owner == caller->name) continue;
      w.job_id.clear();
      w.rank = -1;
    }
  }
  std::sort(workers.begin(), workers.end(), [](const Worker& a, const Worker& b) {
    return std::tie(a.host, a.device, a.id) < std::tie(b.host, b.device, b.id);
  });
  for (const Worker& w : workers) ToProto(w, response->add_workers());
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace ringmaster
