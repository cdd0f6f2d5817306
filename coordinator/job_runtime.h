// What one running job owns on the coordinator: its negotiator, its negotiation metrics, its
// throughput window, its timeline and its autotuner with the autotune log. The coordinator keeps
// one per job between scheduling and the job's end, and reaches the job's ranks through the
// `deliver` callback of Flush().
//
// Thread-safe. mu_ guards the negotiator's cycles, the counters already reported, the throughput
// window and the autotuner, and is held from a poll of the negotiator until the cycle is handed to
// `deliver`, so every rank sees cycles in one order. The autotune log is written by tasks posted to
// the `io` executor (in cycle order: they are posted under mu_), under log_mu_, which guards the
// file alone. The timeline has its own writer thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/executor.h"
#include "common/metrics.h"
#include "coordinator/artifact_store.h"
#include "coordinator/autotuner.h"
#include "coordinator/execution_tracker.h"
#include "coordinator/job.h"
#include "coordinator/negotiator.h"
#include "coordinator/timeline.h"
#include "coordinator/worker_channel.h"

namespace ringmaster {

class JobRuntime : public std::enable_shared_from_this<JobRuntime> {
 public:
  // Opens the runtime of `job` (placed: its ranks and epoch set): its negotiator with the job's
  // knobs, its metric series in `metrics` (borrowed; must outlive the runtime), and, when the knobs
  // ask for them, its timeline and autotune log under `artifacts` (the job's directory is emptied
  // first). Does file I/O: call with no lock held. A file that cannot be created is reported in
  // `problems` (the job runs without it).
  // `io` (borrowed; must outlive the runtime's tasks) writes the autotune log as the job runs.
  //
  // `restored`: the job was running when the coordinator restarted: its artifacts are kept (a
  // timeline is not resumed; the autotune log is appended to), and the runtime restores (see
  // BeginRestore) before it negotiates.
  static std::shared_ptr<JobRuntime> Open(const Job& job, const ArtifactStore& artifacts,
                                          MetricsRegistry& metrics, Executor& io, absl::Time now,
                                          std::vector<std::string>* problems,
                                          bool restored = false);
  ~JobRuntime();

  JobRuntime(const JobRuntime&) = delete;
  JobRuntime& operator=(const JobRuntime&) = delete;

  const std::string& job_id() const { return job_id_; }
  int64_t epoch() const { return epoch_; }
  const std::vector<RankInfo>& ranks() const { return ranks_; }
  // The rank that may relay `rank`'s negotiation (common/relay_plan.h, with the job's
  // negotiation_relay_hosts), -1 for none. REQUIRES: 0 <= rank < ranks().size().
  int32_t RelayOf(int32_t rank) const { return relay_of_[rank]; }
  // The rank worker `worker_id` serves in this epoch, -1 for none.
  int32_t RankOfWorker(const std::string& worker_id) const {
    auto it = rank_of_worker_.find(worker_id);
    return it == rank_of_worker_.end() ? -1 : it->second;
  }

  // One rank's request batch (see Negotiator::Submit). The reliable session: a numbered batch
  // (`seq` > 0) the runtime already has is dropped (false), one re-sent after a reconnect;
  // `ack_responses` (the last response list the rank received in order) lets the runtime forget
  // the lists every rank has.
  // A batch of another cache generation than the runtime's (encoded before a coordinator restart),
  // or any batch while the runtime restores, is dropped too. `used_ids`: cache entries the ranks
  // used in local negotiation since the rank's last batch, marked recently used.
  bool Submit(int32_t rank, std::vector<TensorRequest> requests,
              const std::vector<uint32_t>& cached_ids, absl::Time now, uint64_t seq = 0,
              uint64_t ack_responses = 0, uint64_t cache_generation = 0,
              const std::vector<uint32_t>& used_ids = {});
  // A negotiation relay's batches of this job, each taken or dropped as Submit() would (the
  // result, by batch), and the cache ids the relay shared among them
  // (RelayedBatches.shared_cached_ids), submitted for the ranks whose batches were taken as the
  // first requests of each. One rank's batches are negotiated in order, as Submit()'s are.
  std::vector<char> SubmitRelayed(std::vector<RequestBatch>& batches,
                                  absl::Span<const uint32_t> shared_cached_ids, absl::Time now);
  // The last request batch the runtime has of `rank` (0: none numbered).
  uint64_t LastRequestSeq(int32_t rank) const;
  // A reconnected rank that received the lists up to `after` in order: hands every later list
  // kept to `deliver` (in order, under mu_, as Flush does). FAILED_PRECONDITION, naming the rank,
  // when some of them are no longer kept (more than kKeptCycles behind).
  absl::Status Resend(int32_t rank, uint64_t after,
                      absl::FunctionRef<void(const std::shared_ptr<CycleBroadcast>&)> deliver);
  // Cycles kept for ranks that have not acknowledged them.
  static constexpr size_t kKeptCycles = 4096;

  // Restoring: a restarted coordinator's runtime of a job that was running negotiates nothing
  // until every rank has said what it holds. The ranks' negotiation state is rebuilt from it: a
  // rank that had not received the response lists another one executed gets them (from the lists
  // the others retained), then every rank gets the first list of cache generation `generation`
  // (> 0), which makes it send every request not yet answered again, in full.
  void BeginRestore(uint64_t generation);
  bool restoring() const;
  uint64_t cache_generation() const;
  // What a rank holds (its resume); a later call for the same rank replaces it.
  void Gather(int32_t rank, uint64_t last_response_seq, uint64_t last_request_seq,
              std::vector<std::shared_ptr<CycleBroadcast>> retained);
  // A rank whose worker reattached without it (its process is ending): it negotiates nothing more.
  void Absent(int32_t rank);
  // The ranks not heard from yet.
  std::vector<int32_t> Ungathered() const;
  // Ends the restore (the ranks not gathered, which have exited, and absent ones get nothing):
  // under mu_, hands
  // each gathered rank the lists it lacks and the new generation's first list (`deliver`), then
  // says which request batch the runtime has of it (`resumed`). True when it ended the restore
  // now, false when it had ended already. FAILED_PRECONDITION, naming the rank and the list, when
  // a rank lacks a list no rank retained (the job cannot resume).
  absl::StatusOr<bool> EndRestore(
      absl::FunctionRef<void(int32_t, const std::shared_ptr<CycleBroadcast>&)> deliver,
      absl::FunctionRef<void(int32_t, uint64_t)> resumed);
  // When the first cycle with responses after the restore was negotiated, once (nullopt before
  // it, and after it was taken).
  std::optional<absl::Time> TakeFirstCycleAfterRestore();
  // Every this many cycles, a response list carries the request acknowledgements.
  static constexpr uint64_t kAckEvery = 16;

  // Rank `rank`'s process ended or its rank left (Negotiator::RankEnded): the collectives that
  // need it fail from the next Flush() on.
  void RankEnded(int32_t rank, std::string why, absl::Time now) {
    negotiator_->RankEnded(rank, std::move(why), now);
  }
  // A collective that failed because a rank had ended, since the last call ("" for none).
  std::string TakeEndedRankFailure() { return negotiator_->TakeEndedRankFailure(); }

  // Polls the negotiator; when a cycle is due, counts it (metrics, throughput, timeline), feeds the
  // autotuner (applying what it decides and appending to the autotune log) and hands the cycle to
  // `deliver`, which must only queue (it runs under mu_).
  void Flush(absl::Time now,
             absl::FunctionRef<void(const std::shared_ptr<CycleBroadcast>&)> deliver);

  // The earliest time a cycle falls due (InfiniteFuture when none is pending).
  absl::Time NextDeadline() const { return negotiator_->NextDeadline(); }

  // The job's figures over the 10 s (kWindow) up to `until` (InfiniteFuture: up to its last
  // cycle); rates are 0 once no cycle came for kIdleAfter.
  JobThroughput Throughput(absl::Time until) const;
  static constexpr absl::Duration kWindow = absl::Seconds(10);
  static constexpr absl::Duration kIdleAfter = absl::Seconds(3);

  // Who is slow over the last steps (StragglerTracker) and the workers' last reports
  // (ExecutionTracker): at most kSlowest ranks, those named first, then furthest behind the median
  // rank; nullopt before a step has ended. A rank late to submit is named before a slow link.
  std::optional<JobStragglers> Stragglers() const;
  // What rank `rank`'s worker measured of its collectives (RankExecution). INVALID_ARGUMENT for
  // bad totals.
  absl::Status RecordRankExecution(int32_t rank, const ExecutionTracker::Sample& sample);
  static constexpr size_t kSlowest = 8;
  // The job's straggler_action knob: "none", "warn" or "fail".
  const std::string& straggler_action() const { return straggler_action_; }
  // When Housekeeping saw a rank newly named as holding the job back (none was, or another) and
  // the job has a straggler action: what to say of it, "rank R on host H (worker W) holds the job
  // back: ...", the rank and its verdict; nullopt otherwise. Housekeeping's thread only.
  struct StragglerNotice {
    std::string message;
    int32_t rank = -1;
    std::string verdict;  // "late to submit" or "slow link"
  };
  std::optional<StragglerNotice> TakeStragglerNotice();
  // How often Housekeeping reads who is slow (the window's medians are computed under the
  // negotiator's lock: not at every 100 ms pass).
  static constexpr absl::Duration kLatenessEvery = absl::Seconds(1);

  // Writes the negotiation events since the last call to the timeline, then checks for stalls
  // (updating the stalled-tensors gauge), and sets the lateness gauges.
  StallReport Housekeeping(absl::Time now);

  // What rank `rank`'s worker executed, for the timeline (ignored without one).
  void RecordExecution(int32_t rank, std::vector<ExecutionSpan> spans, int64_t skew_us = 0);

  // The timeline as a read would serve it while the job runs: its file name and the size of its
  // consistent prefix plus the tail that makes it valid JSON. nullopt without a timeline.
  struct TimelineSnapshot {
    std::string name;
    int64_t stable_size = 0;
  };
  std::optional<TimelineSnapshot> Timeline() const;

  // Negotiation relays: which worker's session carries a rank's lists ("" for the rank's own).
  // A batch that came through `relay` routes the rank's lists back through it, unless the rank
  // has gone direct: it resumed (or sent a batch) on its own session, and stays direct for the
  // rest of the epoch, so its lists and batches never take two paths at once but around a resume.
  void RouteVia(int32_t rank, const std::string& relay);
  void RouteDirect(int32_t rank);
  // Whether any rank's lists go through a relay (read without a lock: Flush's fast path).
  bool relayed() const { return relayed_.load(std::memory_order_acquire); }
  // Calls `each` with every rank whose lists go through a relay, and the relay, in rank order.
  void ForEachRelayed(absl::FunctionRef<void(int32_t rank, const std::string& relay)> each) const;

  // Ends the runtime: the timeline's last negotiation events are written and its file closed (its
  // writer thread joined), the stalled gauge is zeroed. Blocks on file I/O: call with no lock held.
  // Idempotent; nothing is recorded afterwards.
  void Close();

 private:
  JobRuntime(const Job& job, MetricsRegistry& metrics, Executor& io);

  // Counts the cycle; returns the bytes of allreduce and broadcast it carried, and its number of
  // allreduce tensors.
  std::pair<int64_t, int64_t> RecordThroughput(const CycleOutput& output, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Feeds the autotuner one cycle and applies what it decides; returns log lines to write.
  std::vector<std::string> Autotune(int64_t bytes, int64_t allreduced, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WriteAutotuneLog(const std::vector<std::string>& lines)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(log_mu_);

  const std::string job_id_;
  const std::string straggler_action_;
  // Housekeeping's thread only: when it last read who is slow, the rank named then, and the notice
  // for TakeStragglerNotice().
  absl::Time last_lateness_ = absl::InfinitePast();
  std::optional<StragglerNotice> straggler_notice_;
  // What was named last ("rank R", late to submit, or "host H", a slow link; "" none): the
  // timeline and the straggler action hear of each change.
  std::string named_key_;
  const int64_t epoch_;
  const std::vector<RankInfo> ranks_;
  const std::vector<int32_t> relay_of_;                             // by rank
  const absl::flat_hash_map<std::string, int32_t> rank_of_worker_;  // by worker id
  Executor& io_;
  std::unique_ptr<Negotiator> negotiator_;
  // The job's series (owned by the registry).
  Counter* const cycles_;
  Counter* const tensors_;
  Counter* const cache_hits_;
  Counter* const cache_misses_;
  Histogram* const latency_;
  Gauge* const stalled_;
  // Who is slow: each rank's lateness behind the median rank, and the straggler's rank (made at
  // the first housekeeping after a step ended; removed at Close). Housekeeping's and Close's.
  MetricsRegistry& metrics_;
  absl::Mutex lateness_mu_;
  Gauge* straggler_ ABSL_GUARDED_BY(lateness_mu_) = nullptr;
  bool lateness_closed_ ABSL_GUARDED_BY(lateness_mu_) = false;
  // The workers' execution figures (RecordRankExecution), under their own lock.
  mutable absl::Mutex execution_mu_;
  ExecutionTracker execution_ ABSL_GUARDED_BY(execution_mu_);
  // Who is slow now: both windows, and the rank named (-1: none).
  struct SlowRanks {
    StragglerTracker::Report lateness;
    ExecutionTracker::Report execution;
    int32_t named = -1;
  };
  SlowRanks WhoIsSlow() const;
  // The rank named, and what to say of it: "late to submit" or "slow link", the figures, and why.
  struct Naming {
    int32_t rank = -1;
    std::string verdict;
    std::string detail;
    std::string why;
  };
  Naming Describe(const SlowRanks& slow) const;
  // Per rank: lateness, shares of time in collectives and across hosts, link send rate.
  struct RankGauges {
    Gauge* lateness;
    Gauge* collective;
    Gauge* network;
    Gauge* link;
  };
  std::vector<RankGauges> rank_gauges_ ABSL_GUARDED_BY(lateness_mu_);
  void SetLatenessGauges(const SlowRanks& slow);
  void NoteStraggler(const SlowRanks& slow);
  // The timeline (null without one) and its file name; set by Open(), before any other call.
  std::unique_ptr<ringmaster::Timeline> timeline_;
  std::string timeline_name_;

  absl::Mutex close_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // held for a whole Close()
  mutable absl::Mutex mu_ ABSL_ACQUIRED_BEFORE(log_mu_);
  NegotiatorStats reported_ ABSL_GUARDED_BY(mu_);  // stats already added to the counters
  // Running totals, and snapshots of them about every second for a 10 s window.
  struct Totals {
    absl::Time time;
    int64_t bytes = 0;
    int64_t tensors = 0;
    int64_t allreduced = 0;  // allreduce tensors alone: steps count in these
    int64_t cycles = 0;
  };
  Totals totals_ ABSL_GUARDED_BY(mu_);
  std::deque<Totals> window_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Autotuner> autotuner_ ABSL_GUARDED_BY(mu_);  // null unless the job autotunes
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  // The reliable session. The cycles sent and not yet acknowledged by every rank, oldest first;
  // the number of the last cycle, and of the last one dropped unacknowledged (the bound).
  std::deque<std::shared_ptr<CycleBroadcast>> kept_ ABSL_GUARDED_BY(mu_);
  uint64_t last_cycle_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t dropped_through_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint64_t> acked_cycles_ ABSL_GUARDED_BY(mu_);  // by rank
  // Restoring: what each rank said it holds (by rank; unset until it resumed).
  struct Gathered {
    uint64_t last_response_seq = 0;
    uint64_t last_request_seq = 0;
    std::vector<std::shared_ptr<CycleBroadcast>> retained;
    bool absent = false;
  };
  bool restoring_ ABSL_GUARDED_BY(mu_) = false;
  // Set at the restore's end until its first cycle with responses (read without the lock first:
  // Flush is the hot path).
  std::atomic<bool> awaiting_first_cycle_{false};
  std::atomic<bool> first_cycle_taken_{true};
  std::optional<absl::Time> first_cycle_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::optional<Gathered>> gathered_ ABSL_GUARDED_BY(mu_);
  void ForgetAcknowledged() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Submit()'s checks of a batch (acknowledgements noted; its generation, and its number against
  // the last one taken); whether it is taken.
  bool Accept(int32_t rank, uint64_t seq, uint64_t ack_responses, uint64_t cache_generation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(submit_mu_);
  // Held while a batch is checked and submitted, so a rank's batches (an old session's and the
  // new one's may overlap for a moment) are deduplicated and negotiated in order.
  absl::Mutex submit_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::vector<uint64_t> last_request_ ABSL_GUARDED_BY(mu_);  // by rank

  // Routes (a leaf lock: nothing is called under it).
  mutable absl::Mutex routes_mu_;
  std::vector<std::string> via_ ABSL_GUARDED_BY(routes_mu_);  // by rank; "": its own session
  std::vector<bool> direct_ ABSL_GUARDED_BY(routes_mu_);      // by rank: gone direct for good
  std::atomic<bool> relayed_{false};

  absl::Mutex log_mu_;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> autotune_log_ ABSL_GUARDED_BY(log_mu_){
      nullptr, &std::fclose};
};

}  // namespace ringmaster
