// The Horovod controller as a service: per job, collects every rank's tensor requests, decides
// which are ready (submitted by every non-joined rank), validates that all ranks agree, orders and
// fuses the ready ones, and produces one response list that every rank executes in the same order.
//
// Thread-safe: one mutex guards all state; no method blocks or performs I/O.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/node_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "coordinator/negotiation_types.h"
#include "coordinator/response_cache.h"
#include "coordinator/straggler_tracker.h"

namespace ringmaster {

struct NegotiatorOptions {
  std::string job_id;
  // Host of each rank (size = number of ranks); named in error messages.
  std::vector<std::string> rank_hosts;
  int64_t fusion_threshold_bytes = int64_t{128} << 20;  // 0 disables fusion
  absl::Duration cycle_time = absl::Milliseconds(1);
  int cache_capacity = 1024;
  absl::Duration stall_check = absl::Seconds(60);        // zero disables stall reports
  absl::Duration stall_shutdown = absl::ZeroDuration();  // zero: never fail on a stall
  // Keep NegotiationEvents for the job's timeline (DrainTimeline()).
  bool record_timeline = false;
};

struct StallReport {
  // Empty when nothing newly crossed the stall-check time since the last report.
  std::string message;
  // A tensor has waited longer than the stall-shutdown time: the job must fail with `message`.
  bool shutdown = false;
  // Tensors waiting longer than the stall-check time now (reported or not).
  int stalled = 0;
};

struct NegotiatorStats {
  int64_t tensors_negotiated = 0;  // tensors that left in a response (errors included)
  int64_t cycles = 0;              // Poll() calls that produced output
  int64_t cache_hits = 0;          // ready tensors first requested by cache id
  int64_t cache_misses = 0;        // ready tensors first requested in full
  int64_t requests = 0;            // tensor requests received, full or by id
  // Different allreduce tensor names negotiated so far: a training step's worth.
  int64_t distinct_tensors = 0;
};

class Negotiator {
 public:
  // The most tensors one job may have in negotiation at once (submitted by some ranks, not yet by
  // all). A model's step has hundreds; past this, a new name is an error to the rank that sent
  // it, so a rank that never stops sending names no other rank sends cannot grow the coordinator.
  static constexpr size_t kMaxPending = 65536;

  explicit Negotiator(NegotiatorOptions options);

  Negotiator(const Negotiator&) = delete;
  Negotiator& operator=(const Negotiator&) = delete;

  int size() const { return size_; }

  // Records one batch of requests from `rank`: full requests, and requests by response-cache id.
  // Malformed requests, names already in flight on that rank and unknown cache ids do not disturb
  // anything else: they become notices to that rank in the next Poll().
  // REQUIRES: 0 <= rank < size() (the caller has checked the rank belongs to the job).
  void Submit(int rank, std::vector<TensorRequest> requests, absl::Span<const uint32_t> cached_ids,
              absl::Time now);

  // Requests by cache id that every rank of `ranks` sent (a negotiation relay's shared ids): what
  // Submit(rank, {}, cached_ids) would do for each rank, one id at a time across the ranks, each
  // id's pending tensor found once.
  // REQUIRES: 0 <= each rank < size().
  void SubmitShared(absl::Span<const int32_t> ranks, absl::Span<const uint32_t> cached_ids,
                    absl::Time now);

  // Rank `rank`'s process ended (any status) or its rank left: `why` says so, naming the rank, its
  // host and its exit ("rank 1 on host h1 exited with status 0"). Every collective of a set with
  // the rank in it that is in negotiation now, or is submitted later, can never complete: it fails
  // on every rank concerned (in this cycle's responses, or as an error to each later submitter),
  // and so does a join other ranks wait in. A rank that ended with nothing pending harms nobody.
  // Idempotent: the first `why` stands.
  // REQUIRES: 0 <= rank < size().
  void RankEnded(int rank, std::string why, absl::Time now);
  // The first error made since the last call by a rank's end (RankEnded): what a job that is not
  // elastic fails with. Empty when none.
  std::string TakeEndedRankFailure();

  // Marks the cache entries of `ids` most recently used (tensors the ranks negotiated among
  // themselves: local negotiation); unknown ids are ignored.
  void Touch(absl::Span<const uint32_t> ids);

  // The cycle's output when one is due at `now`: when there are notices, or ready tensors and
  // either nothing is partially submitted, the cycle time has passed since the first became ready,
  // or a full fusion buffer is ready. nullopt otherwise.
  std::optional<CycleOutput> Poll(absl::Time now);

  // The earliest time at which Poll() would produce output if nothing else arrived;
  // absl::InfiniteFuture() when nothing is ready.
  absl::Time NextDeadline() const;

  // Tensors that some ranks submitted and others have not, for longer than the stall-check time.
  // Each stalled tensor is reported once per stall-check period.
  StallReport CheckStalls(absl::Time now);

  // Autotune moves these; they apply from the next Poll().
  void SetParameters(int64_t fusion_threshold_bytes, absl::Duration cycle_time);
  // Turns the response cache off (every id is evicted in the next cycle's output, so ranks send
  // tensors in full again) or back on (with the configured capacity).
  void SetCacheEnabled(bool enabled);
  bool cache_enabled() const;

  // Negotiation events recorded since the last call, in the order they happened (empty unless
  // NegotiatorOptions::record_timeline).
  std::vector<NegotiationEvent> DrainTimeline();

  NegotiatorStats stats() const;
  // Who is slow: each rank's lateness to the job's collectives over the last steps
  // (StragglerTracker, fed with every rank's request).
  StragglerTracker::Report Stragglers() const;
  int64_t fusion_threshold_bytes() const;
  absl::Duration cycle_time() const;

 private:
  // One bit per rank: a tensor's "submitted" flags, 128 bytes a tensor at 1024 ranks instead of
  // a kilobyte (every rank's request for every tensor of a step marks them).
  class RankBits {
   public:
    void Reset(int ranks) { words_.assign((static_cast<size_t>(ranks) + 63) / 64, 0); }
    bool operator[](int rank) const { return (words_[Word(rank)] >> Bit(rank)) & 1; }
    void Set(int rank) { words_[Word(rank)] |= uint64_t{1} << Bit(rank); }

   private:
    static size_t Word(int rank) { return static_cast<size_t>(rank) / 64; }
    static int Bit(int rank) { return rank % 64; }
    std::vector<uint64_t> words_;
  };

  struct Pending {
    TensorRequest request;  // as the first rank submitted it
    int first_rank = 0;
    uint32_t cache_id = 0;    // nonzero: `request` equals this cache entry
    uint32_t indexed_id = 0;  // nonzero: its key in pending_by_id_
    RankBits submitted;
    int count = 0;
    std::vector<int64_t> first_dims;  // allgather: each rank's first dimension
    absl::Time first_submit;
    int64_t first_submit_ns = 0;  // the same, in Unix nanoseconds (the lateness's hot path)
    bool timed = false;           // its requests' lateness goes to stragglers_ (a sampled tensor)
    absl::Time last_stall_report = absl::InfinitePast();
    std::string error;  // the first mismatch found
    bool ready = false;
  };

  // Tensors that leave together: one tensor, a whole group, or an all-joined marker.
  struct Unit {
    std::vector<Pending*> tensors;
    bool join = false;
    int last_joined_rank = -1;
  };

  std::string RankName(int rank) const;
  // "Allreduce of tensor 'x' can never complete: <why>" for rank `rank`'s end.
  std::string NeverCompletes(const TensorRequest& r, int rank, bool submitted_by_it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The error of a join that waits for ended rank `rank`.
  std::string JoinNeverCompletes(int rank) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The first ended rank of the request's set, -1 for none.
  int EndedRankOf(const TensorRequest& r) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static std::string Validate(const TensorRequest& r, int size);
  std::string Mismatch(const Pending& p, const TensorRequest& r, int rank) const;
  int64_t ByteSize(const Pending& p) const;
  bool Compatible(const Pending& a, const Pending& b) const;

  void SubmitOne(int rank, const TensorRequest& request, uint32_t cache_id, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Join(int rank, const std::string& name, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool AllSubmitted(const Pending& p) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MarkReady(Pending* p, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordTimeline(NegotiationEvent::Kind kind, const TensorRequest& request, int32_t rank,
                      absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RankError(int rank, const std::string& name, std::string message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A step ended (StragglerTracker): its last rank marked on the timeline.
  void RecordStep(const StragglerTracker::StepEnd& end, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A request by cache id for a tensor in pending_by_id_ (`p`): what SubmitOne does for it.
  void SubmitCached(int rank, Pending& p, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A request by cache id whose tensor is not in pending_by_id_: from the cache, or a resend.
  void SubmitUnindexed(int rank, uint32_t id, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes ids that left the cache from pending_by_id_.
  void ForgetIds(absl::Span<const uint32_t> ids) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool DueLocked(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Response MakeResponse(const std::vector<Pending*>& tensors) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string job_id_;
  const std::vector<std::string> rank_hosts_;
  const int size_;

  mutable absl::Mutex mu_;
  int64_t fusion_threshold_bytes_ ABSL_GUARDED_BY(mu_);
  absl::Duration cycle_time_ ABSL_GUARDED_BY(mu_);
  const absl::Duration stall_check_;
  const absl::Duration stall_shutdown_;
  ResponseCache cache_ ABSL_GUARDED_BY(mu_);
  bool cache_enabled_ ABSL_GUARDED_BY(mu_) = true;
  std::vector<uint32_t> evicted_ ABSL_GUARDED_BY(mu_);  // by SetCacheEnabled(false), not yet told
  absl::flat_hash_set<std::string> seen_ ABSL_GUARDED_BY(mu_);  // distinct allreduce names
  const bool record_timeline_;
  std::vector<NegotiationEvent> timeline_ ABSL_GUARDED_BY(mu_);
  absl::Time last_timeline_time_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::node_hash_map<std::string, Pending> pending_ ABSL_GUARDED_BY(mu_);
  // The steady state's shortcut: pending tensors first submitted by a cache id that is still
  // valid, by that id. A later rank's request by the same id goes straight to its entry (no
  // cache lookup, no name hashed). Ids leave it when their tensor leaves pending_ or the cache.
  absl::flat_hash_map<uint32_t, Pending*> pending_by_id_ ABSL_GUARDED_BY(mu_);
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;  // pending tensors not yet ready
  std::vector<Unit> ready_ ABSL_GUARDED_BY(mu_);
  int64_t ready_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time first_ready_time_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  // Ready members of groups whose other members are not ready yet, by group id.
  // By (process set, group id): each set numbers its groups on its own.
  absl::flat_hash_map<std::pair<int32_t, int32_t>, std::vector<Pending*>> group_ready_
      ABSL_GUARDED_BY(mu_);
  std::vector<uint8_t> joined_ ABSL_GUARDED_BY(mu_);
  int joined_count_ ABSL_GUARDED_BY(mu_) = 0;
  // The name of the join each joined rank waits in (its error, should the join never complete).
  std::vector<std::string> join_names_ ABSL_GUARDED_BY(mu_);
  // Why each rank ended ("" while it runs), and how many have.
  std::vector<std::string> ended_ ABSL_GUARDED_BY(mu_);
  int ended_count_ ABSL_GUARDED_BY(mu_) = 0;
  std::string ended_failure_ ABSL_GUARDED_BY(mu_);  // TakeEndedRankFailure()'s
  std::vector<RankNotice> notices_ ABSL_GUARDED_BY(mu_);
  bool has_notices_ ABSL_GUARDED_BY(mu_) = false;
  NegotiatorStats stats_ ABSL_GUARDED_BY(mu_);
  StragglerTracker stragglers_ ABSL_GUARDED_BY(mu_);
  // The current Submit's or SubmitShared's time in Unix nanoseconds (converted once per batch).
  int64_t now_ns_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ringmaster
