// The worker daemon: one per GPU or CPU slot, long-lived, serving one rank at a time. It is the
// worker's composition root: it owns the coordinator session, the local server with its API, the
// metrics endpoint and the registry of its rank's runner (JobRunner: one per epoch), and routes
// the coordinator's messages and the local API's calls to that runner. An assignment that comes
// while the previous rank is still cleaned up waits for it; an elastic job's next epoch takes over
// the running process.
//
// Thread-safe: mu_ guards the registry; coordinator messages arrive on the session thread,
// training-process requests on local-server threads, the rank's exit on its waiter thread.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/coordinator_channels.h"
#include "common/metrics_server.h"
#include "common/thread_list.h"
#include "worker/job_runner.h"
#include "worker/local/local_api.h"
#include "worker/local/local_server.h"
#include "worker/negotiation/coordinator_session.h"
#include "worker/rendezvous/net_address.h"
#include "worker/worker_context.h"

namespace ringmaster {

class Daemon : public CoordinatorSession::Listener, public JobRunner::Owner, public LocalApi::Jobs {
 public:
  explicit Daemon(DaemonOptions options);
  ~Daemon() override;

  // Opens the local socket and the metrics endpoint, and starts the coordinator session.
  absl::Status Start();
  // The metrics port (0 when not serving metrics).
  int metrics_port() const { return metrics_server_ ? metrics_server_->port() : 0; }
  // Blocks until Shutdown() or a coordinator `shutdown`; then stops the job and everything else.
  void Run();
  void Shutdown();

  // CoordinatorSession::Listener
  void OnMessage(const v1::CoordinatorMessage& message) override;
  void OnSessionLost(const absl::Status& status, bool reregistered) override;
  void OnSessionOpen(v1::SessionOpen* open) override;

  // JobRunner::Owner
  std::shared_ptr<JobRunner> Current() override;
  void Finished(const std::shared_ptr<JobRunner>& runner) override;
  void DisconnectLocal() override;

  // LocalApi::Jobs
  std::shared_ptr<JobRunner> ServingJob() override;

 private:
  // Start()'s parts: the daemon's own checks and defaults (host name, interface, fault injection,
  // data-plane address), the device served, the metrics endpoint, the coordinator session.
  absl::Status Configure();
  absl::Status OpenDevice();
  absl::Status StartMetrics();
  absl::Status StartSession();
  // A new assignment: a new rank, an elastic job's next epoch (taking over the process), or one
  // queued until the previous rank is cleaned up.
  void StartJob(const v1::JobAssignment& assignment);
  // Stops the job's rank because of `reason`. `epoch` > 0: that epoch only; an elastic job's
  // process then stays for the next epoch.
  void StopJob(const std::string& job_id, const absl::Status& reason, int64_t epoch = 0);
  // The served runner if it is `job_id`'s (and, epoch > 0, that epoch's), else null.
  std::shared_ptr<JobRunner> ServingJob(const std::string& job_id, int64_t epoch = 0);
  // Stops the current job's rank once the coordinator has been unreachable for the grace.
  void CheckCoordinatorGrace();
  // The address the data plane listens on (see net_address.h); found again while unknown (a
  // coordinator name that did not resolve at start).
  absl::StatusOr<LocalAddress> DataAddress();
  WorkerContext Context();

  const DaemonOptions options_;
  int cuda_device_ = -1;                   // the GPU served (--device cuda:N), -1 for a CPU slot
  const GpuPlugin* gpu_plugin_ = nullptr;  // loaded at start for a GPU slot; lives as the process
  // RINGMASTER_FAULT_CLOCK_OFFSET_SECONDS: set at Start(), read after.
  absl::Duration wall_clock_offset_;
  MetricsRegistry metrics_;
  std::unique_ptr<MetricsServer> metrics_server_;
  // The coordinator's address, or its replicas' (following the leader).
  std::shared_ptr<CoordinatorChannels> channel_;
  std::unique_ptr<CoordinatorSession> session_;
  std::atomic<bool> session_started_{false};  // session_ is set (read by /readyz)
  // The local API before the server that calls it, so it is destroyed after it.
  std::unique_ptr<LocalApi> local_api_;
  std::unique_ptr<LocalServer> local_;

  absl::Mutex mu_;
  std::shared_ptr<JobRunner> job_ ABSL_GUARDED_BY(mu_);
  // An assignment that arrived while the previous job was still being cleaned up.
  std::optional<v1::JobAssignment> queued_ ABSL_GUARDED_BY(mu_);
  // The last job this daemon ran to its end ("JOB@EPOCH"): an assignment of it sent again (a
  // coordinator that had not heard of its end yet) does not start it twice.
  std::string finished_ ABSL_GUARDED_BY(mu_);
  std::optional<LocalAddress> data_address_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time unreachable_since_ = absl::InfiniteFuture();  // Run()'s thread only
  ThreadList finishers_;  // cleanups and terminations: joined before the rest goes
};

}  // namespace ringmaster
