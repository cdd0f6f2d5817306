// The coordinator's composition root and the glue between its parts: it owns the job registry, the
// worker registry, the rendezvous store and one negotiator per running job, in dependency order, and
// implements the operations the services expose. Transport-free: services translate messages and
// call it; it talks to workers through WorkerChannel.
//
// Thread-safe. mu_ guards the job runtimes and the worker channels. Channels are called with mu_ held:
// their methods only queue a message (they never block or call back), and holding mu_ keeps a closing
// session's channel alive. Watchers and negotiators are called with mu_ released.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/job_registry.h"
#include "coordinator/negotiator.h"
#include "coordinator/rendezvous_store.h"
#include "coordinator/worker_channel.h"
#include "coordinator/worker_registry.h"

namespace ringmaster {

struct CoordinatorOptions {
  Clock* clock = Clock::Real();  // borrowed; must outlive the coordinator
  std::unique_ptr<JobStore> store = JobStore::InMemory();
  absl::Duration lease = absl::Seconds(10);
  absl::Duration heartbeat_interval = absl::Seconds(2);
  // How often Tick() expires leases, checks stalls and expires rendezvous waiters.
  absl::Duration housekeeping_interval = absl::Milliseconds(100);
};

// One rank's request batch, as the session received it.
struct RequestBatch {
  std::string job_id;
  int64_t epoch = 0;
  int32_t rank = 0;
  std::vector<TensorRequest> requests;
  std::vector<uint32_t> cached_ids;
};

struct RankUpdate {
  std::string job_id;
  int64_t epoch = 0;
  int32_t rank = 0;
  RankState state = RankState::kStarted;
  int32_t exit_code = 0;
  std::string message;
};

class Coordinator {
 public:
  explicit Coordinator(CoordinatorOptions options);
  ~Coordinator();

  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  absl::Duration lease() const { return workers_.lease(); }
  absl::Duration heartbeat_interval() const { return heartbeat_interval_; }

  // Jobs.
  absl::StatusOr<Job> RegisterJob(JobSpec spec);
  absl::StatusOr<Job> GetJob(const std::string& id) const { return jobs_.Get(id); }
  std::vector<Job> ListJobs(const std::vector<JobState>& states) const {
    return jobs_.List(states);
  }
  absl::StatusOr<Job> CancelJob(const std::string& id, std::string reason);
  absl::StatusOr<int64_t> WatchJob(const std::string& id, JobRegistry::Watcher watcher) {
    return jobs_.Watch(id, std::move(watcher));
  }
  void UnwatchJob(const std::string& id, int64_t watch_id) { jobs_.Unwatch(id, watch_id); }

  // Workers.
  absl::StatusOr<Worker> RegisterWorker(std::string host, std::string device,
                                        std::map<std::string, std::string> labels);
  std::vector<Worker> ListWorkers() const { return workers_.List(); }
  // Attaches the worker's session. `channel` is borrowed until CloseSession(). NOT_FOUND for an
  // unknown worker, FAILED_PRECONDITION for one whose lease expired.
  absl::Status OpenSession(const std::string& worker_id, WorkerChannel* channel);
  void CloseSession(const std::string& worker_id, WorkerChannel* channel);
  absl::Status Heartbeat(const std::string& worker_id);
  // FAILED_PRECONDITION when the worker does not serve that rank of that job; ABORTED for a stale epoch.
  absl::Status SubmitRequests(const std::string& worker_id, RequestBatch batch);
  absl::Status UpdateRank(const std::string& worker_id, const RankUpdate& update);

  // Rendezvous, scoped by job and epoch: NOT_FOUND (job), ABORTED (stale epoch), FAILED_PRECONDITION
  // (job not starting or running).
  absl::Status RendezvousSet(const std::string& job_id, int64_t epoch, const std::string& key,
                             std::string value);
  absl::StatusOr<std::string> RendezvousGet(const std::string& job_id, int64_t epoch,
                                            const std::string& key);
  void RendezvousWait(const std::string& job_id, int64_t epoch, std::vector<std::string> keys,
                      absl::Duration timeout, RendezvousStore::WaitCallback done);

  // Flushes due negotiation cycles; every housekeeping interval also expires worker leases, reports
  // and acts on stalls, and expires rendezvous waits. The server calls it about every millisecond;
  // tests call it after moving a FakeClock.
  void Tick();

  // The earliest negotiation deadline of any job (InfiniteFuture when none).
  absl::Time NextDeadline() const;

  // Graceful server stop: tells every connected worker to shut down and fails pending rendezvous
  // waits with UNAVAILABLE.
  void Shutdown(const std::string& reason);

 private:
  // A job's live state while it has workers.
  struct Runtime {
    std::string job_id;
    int64_t epoch = 0;
    std::vector<RankInfo> ranks;
    std::unique_ptr<Negotiator> negotiator;
    // Held from Poll() until the cycle is queued on every channel, so all ranks see cycles in order.
    absl::Mutex flush_mu ABSL_ACQUIRED_BEFORE(mu_);
  };

  // Places pending jobs on idle workers, oldest first.
  void Schedule();
  // Ends the job in `state` (FAILED or CANCELLED or SUCCEEDED) with `reason`: stops its other ranks,
  // frees its workers and drops its rendezvous scope.
  absl::StatusOr<Job> Finish(const std::string& job_id, JobState state, std::string reason,
                             const std::string& except_worker = "");
  absl::StatusOr<std::shared_ptr<Runtime>> RuntimeFor(const std::string& worker_id,
                                                      const std::string& job_id, int64_t epoch,
                                                      int32_t rank);
  absl::Status CheckScope(const std::string& job_id, int64_t epoch) const;
  void Flush(const std::shared_ptr<Runtime>& runtime, absl::Time now);
  void Housekeeping(absl::Time now);
  WorkerChannel* ChannelOf(const std::string& worker_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Clock* const clock_;
  const absl::Duration heartbeat_interval_;
  const absl::Duration housekeeping_interval_;
  JobRegistry jobs_;
  WorkerRegistry workers_;
  RendezvousStore rendezvous_;

  // Serialises scheduling decisions (read idle workers, assign, start), which span registries.
  absl::Mutex schedule_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Runtime>> runtimes_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, WorkerChannel*> channels_ ABSL_GUARDED_BY(mu_);
  absl::Time last_housekeeping_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace ringmaster
