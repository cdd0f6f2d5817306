// Jobs and their state machine: PENDING -> STARTING -> RUNNING -> SUCCEEDED | FAILED | CANCELLED
// (PENDING and STARTING may also end FAILED or CANCELLED). Every terminal state carries a reason;
// every change is an event that watchers receive.
//
// Thread-safe: one mutex guards the registry; watchers are called with it released, in event order
// per job.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "coordinator/job.h"
#include "coordinator/job_store.h"

namespace ringmaster {

class JobRegistry {
 public:
  // Called after each event with the job as it is after it. Must not block, and must not call back
  // into the registry (it runs under the registry's notification lock).
  using Watcher = std::function<void(const Job& job, const JobEvent& event)>;

  // What one user, and everyone together, may hold and start. Zero: no per-user bound.
  struct Limits {
    int64_t max_active = 1000;                 // jobs not ended, all users together
    int64_t max_active_per_user = 0;           // jobs not ended, one owner's
    int64_t max_registrations_per_minute = 0;  // one owner's, in any 60 s
  };

  // `clock` is borrowed and must outlive the registry.
  // At most `max_active` jobs that have not ended are held: Register refuses more.
  JobRegistry(std::unique_ptr<JobStore> store, Clock* clock, int64_t max_active = 1000);
  JobRegistry(std::unique_ptr<JobStore> store, Clock* clock, Limits limits);

  // Validates the spec (INVALID_ARGUMENT naming the field), fills in nothing else, and records a
  // new PENDING job owned by `owner` (at most 256 bytes). RESOURCE_EXHAUSTED naming the limit when
  // max_active jobs have not ended, when `owner` holds max_active_per_user of them, or registered
  // max_registrations_per_minute jobs in the last minute: one user cannot take the cluster from
  // the others. A spec with a request_id this owner used before (for a job still kept, among the
  // last 10,000 so registered) returns that job instead: a retried registration is idempotent.
  // A job that ends keeps its environment's names, not their values (secrets are kept no longer
  // than needed).
  absl::StatusOr<Job> Register(JobSpec spec, std::string owner = "");

  absl::StatusOr<Job> Get(const std::string& id) const;
  // Removes ended jobs that ended at or before `now - retention`, and the oldest ended ones beyond
  // `max_ended` ended jobs; returns their ids. The newest job is always kept: it carries the
  // highest id, from which a restarted coordinator numbers new jobs (an id is never used twice).
  std::vector<std::string> Evict(absl::Time now, absl::Duration retention, int64_t max_ended);
  // Newest first; only jobs in `states` when it is not empty.
  std::vector<Job> List(const std::vector<JobState>& states) const;

  // Moves the job to `to` with `message` as the event (and reason, for a terminal state). A
  // terminal state stops every rank that had not exited (RankState::kStopped) and keeps
  // `final_throughput` (when given) as the job's last figures. FAILED_PRECONDITION when the move is
  // not allowed (e.g. the job already ended); NOT_FOUND.
  absl::StatusOr<Job> Transition(const std::string& id, JobState to, std::string message,
                                 std::optional<JobThroughput> final_throughput = std::nullopt);

  // Places the job's ranks and increments its epoch; the job moves to STARTING.
  absl::StatusOr<Job> Start(const std::string& id, std::vector<RankInfo> ranks,
                            std::string message);

  // Elastic jobs: the ranks of a new epoch (renumbered; the spec's np becomes their number), with a
  // new rendezvous token; the epoch and the reset count go up, the state stays STARTING or
  // RUNNING. FAILED_PRECONDITION for a job that is not elastic or not placed.
  absl::StatusOr<Job> NextEpoch(const std::string& id, std::vector<RankInfo> ranks,
                                std::string message);

  // Records a rank's new state. Returns the job after the update.
  absl::StatusOr<Job> UpdateRank(const std::string& id, int rank, RankState state, int exit_code);

  // Adds an event without changing state (e.g. a stall report).
  absl::Status AddEvent(const std::string& id, std::string message);

  // Registers `watcher` for the job; returns an id for Unwatch. NOT_FOUND for an unknown job.
  absl::StatusOr<int64_t> Watch(const std::string& id, Watcher watcher);
  void Unwatch(const std::string& id, int64_t watch_id);

 private:
  // Records `event` on `job`, stores it, and returns the watchers to notify.
  std::vector<std::shared_ptr<Watcher>> CommitLocked(Job& job, std::string message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Job> LoadLocked(const std::string& id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Start (a PENDING job placed) or NextEpoch (`next_epoch`: an elastic job's new ranks).
  absl::StatusOr<Job> Place(const std::string& id, std::vector<RankInfo> ranks, std::string message,
                            bool next_epoch);
  static void Notify(const std::vector<std::shared_ptr<Watcher>>& watchers, const Job& job);

  Clock* const clock_;
  mutable absl::Mutex mu_;
  // Serialises notifications so each watcher sees a job's events in order.
  absl::Mutex notify_mu_ ABSL_ACQUIRED_AFTER(mu_);
  const std::unique_ptr<JobStore> store_ ABSL_PT_GUARDED_BY(mu_);
  int64_t next_job_ ABSL_GUARDED_BY(mu_) = 1;
  const Limits limits_;
  // Jobs not ended, by id: their owners; and how many each owner has.
  absl::flat_hash_map<std::string, std::string> active_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int64_t> active_by_owner_ ABSL_GUARDED_BY(mu_);
  // When each owner registered jobs in the last minute (at most the limit each; owners with none
  // are dropped).
  absl::flat_hash_map<std::string, std::deque<absl::Time>> registrations_ ABSL_GUARDED_BY(mu_);
  void SetActiveLocked(const Job& job, bool active) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Jobs registered with a request id, by owner and request id ("owner\x1frequest_id"): the last
  // kRememberedRequests of them, oldest first out.
  static constexpr size_t kRememberedRequests = 10'000;
  absl::flat_hash_map<std::string, std::string> by_request_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> request_order_ ABSL_GUARDED_BY(mu_);
  void RememberRequestLocked(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status last_put_ ABSL_GUARDED_BY(mu_);  // how the last CommitLocked's write went
  int64_t next_watch_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<std::string, absl::flat_hash_map<int64_t, std::shared_ptr<Watcher>>> watchers_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace ringmaster
