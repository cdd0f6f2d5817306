// ringmaster.v1.JobService over the Coordinator: translates messages and status codes, nothing
// else.
#pragma once

#include "common/executor.h"
#include "coordinator/coordinator.h"
#include "ringmaster/v1/job.grpc.pb.h"

namespace ringmaster {

class JobService final : public v1::JobService::CallbackService {
 public:
  // `coordinator` is borrowed and must outlive the service. `io` runs the artifact calls' file I/O
  // (borrowed; it must run every task posted before the service goes); null: Executor::Inline().
  explicit JobService(Coordinator& coordinator, Executor* io = nullptr)
      : coordinator_(coordinator), io_(io != nullptr ? *io : Executor::Inline()) {}

  grpc::ServerUnaryReactor* RegisterJob(grpc::CallbackServerContext* context,
                                        const v1::RegisterJobRequest* request,
                                        v1::RegisterJobResponse* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const v1::GetJobRequest* request,
                                   v1::GetJobResponse* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const v1::ListJobsRequest* request,
                                     v1::ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const v1::CancelJobRequest* request,
                                      v1::CancelJobResponse* response) override;
  grpc::ServerWriteReactor<v1::WatchJobResponse>* WatchJob(
      grpc::CallbackServerContext* context, const v1::WatchJobRequest* request) override;
  grpc::ServerWriteReactor<v1::GetLogsResponse>* GetLogs(
      grpc::CallbackServerContext* context, const v1::GetLogsRequest* request) override;
  grpc::ServerUnaryReactor* ListArtifacts(grpc::CallbackServerContext* context,
                                          const v1::ListArtifactsRequest* request,
                                          v1::ListArtifactsResponse* response) override;
  grpc::ServerWriteReactor<v1::GetArtifactResponse>* GetArtifact(
      grpc::CallbackServerContext* context, const v1::GetArtifactRequest* request) override;

 private:
  Coordinator& coordinator_;
  Executor& io_;
};

}  // namespace ringmaster
