// ringmaster.v1.JobService over the Coordinator: translates messages and status codes, nothing
// else.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "common/certificate_trust.h"
#include "common/executor.h"
#include "coordinator/coordinator.h"
#include "coordinator/service/auth.h"
#include "ringmaster/v1/job.grpc.pb.h"

namespace ringmaster {

class JobService final : public v1::JobService::CallbackService {
 public:
  // `coordinator` is borrowed and must outlive the service. `io` runs the artifact calls' file I/O
  // (borrowed; it must run every task posted before the service goes); null: Executor::Inline().
  // `auth` (borrowed) says who calls; null: nobody authenticates (everyone is the operator).
  // A job belongs to the user who registered it: other users get PERMISSION_DENIED on it, and
  // ListJobs shows each user their own (admins see and act on all); worker identities may not
  // register jobs. Environment values are redacted in every reply.
  // `uploads` (borrowed, like `io`) writes and checks the code archives SubmitJob receives; null:
  // `io`.
  explicit JobService(Coordinator& coordinator, Executor* io = nullptr,
                      const Authenticator* auth = nullptr, Executor* uploads = nullptr)
      : coordinator_(coordinator),
        io_(io != nullptr ? *io : Executor::Inline()),
        uploads_(uploads != nullptr ? *uploads : io_),
        auth_(auth != nullptr ? *auth : kNoAuthentication) {}

  grpc::ServerUnaryReactor* RegisterJob(grpc::CallbackServerContext* context,
                                        const v1::RegisterJobRequest* request,
                                        v1::RegisterJobResponse* response) override;
  // Registers the job once its code archive has arrived whole and passed the checks.
  grpc::ServerReadReactor<v1::SubmitJobRequest>* SubmitJob(
      grpc::CallbackServerContext* context, v1::RegisterJobResponse* response) override;
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
  // Ends every stream (WatchJob, GetLogs) that a bearer token no longer in the token file opened,
  // UNAUTHENTICATED: a revoked token keeps nothing open. The server calls it about every second
  // (the token file's reload period).
  void EndStreamsOfRevokedTokens();
  // Ends, UNAUTHENTICATED, every stream opened with a client certificate `trust` no longer accepts
  // (its CA left the bundle, or it expired). The server calls it when the bundle changed.
  void EndStreamsOfUntrustedCertificates(const CertificateTrust& trust);

  grpc::ServerUnaryReactor* ListArtifacts(grpc::CallbackServerContext* context,
                                          const v1::ListArtifactsRequest* request,
                                          v1::ListArtifactsResponse* response) override;
  grpc::ServerWriteReactor<v1::GetArtifactResponse>* GetArtifact(
      grpc::CallbackServerContext* context, const v1::GetArtifactRequest* request) override;

 private:
  static const Authenticator kNoAuthentication;

  // The caller, allowed to act on job `job_id`: UNAUTHENTICATED, NOT_FOUND or PERMISSION_DENIED.
  absl::Status AuthorizeJob(const grpc::CallbackServerContext& context,
                            const std::string& job_id) const;

  // Registrations waiting on `uploads_`; past the bound, RESOURCE_EXHAUSTED at once.
  static constexpr int kMaxQueuedRegistrations = 64;

  Coordinator& coordinator_;
  Executor& io_;
  Executor& uploads_;
  const Authenticator& auth_;
  std::atomic<int> queued_registrations_{0};

  // Streams opened with a bearer token or a client certificate, by id: the token or the
  // certificate (PEM), and how to end the stream.
  struct TokenStream {
    std::string token;
    std::string certificate;
    std::function<void(const grpc::Status&)> end;
  };
  // Tracks a stream of `context` when it carries a token or a certificate; returns what OnDone()
  // must call.
  std::function<void()> TrackToken(const grpc::CallbackServerContext& context,
                                   std::function<void(const grpc::Status&)> end);
  // Ends (with `why`) and forgets every tracked stream `ends` picks.
  void EndStreamsWhere(absl::FunctionRef<bool(const TokenStream&)> ends, const grpc::Status& why)
      ABSL_LOCKS_EXCLUDED(streams_mu_);
  absl::Mutex streams_mu_;
  absl::flat_hash_map<int64_t, TokenStream> token_streams_ ABSL_GUARDED_BY(streams_mu_);
  int64_t next_stream_ ABSL_GUARDED_BY(streams_mu_) = 1;
};

}  // namespace ringmaster
