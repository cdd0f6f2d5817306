// The worker's side of the reliable session for one rank (one job epoch): request batches are
// numbered and kept until the coordinator acknowledges them; response lists are applied in their
// numbered order, once each. After a session breaks, new batches are only kept (not sent) until the
// new session's `resumed` says which batch the coordinator has last; then every later one is sent
// again, in order, and the rank goes on. The coordinator re-sends the lists the rank lacks; one
// that arrives before the re-sent ones is held until they have come.
//
// For a coordinator that restarts (and so has no cycles kept), the ledger also retains the lists
// this rank applied that not every rank is known to have (ResponseList.all_have), and says in its
// resume which batch it numbered last: the new coordinator gives a rank that lags the lists the
// others executed, then starts a new response-cache generation (the engine's part).
//
// Thread-safe: the engine's thread sends batches, the session thread delivers lists and resumes.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "ringmaster/v1/worker.pb.h"

namespace ringmaster {

class SessionLedger {
 public:
  // Batches kept for re-sending at most (the oldest are forgotten beyond: they are acknowledged
  // every few cycles, so only a coordinator gone for long gets there), and lists held out of order.
  static constexpr size_t kMaxKept = 4096;
  static constexpr size_t kMaxHeld = 4096;
  // Lists retained for a coordinator restart, at most (the oldest are forgotten beyond: every rank
  // acknowledges lists every few cycles, so only a rank far behind the others gets there).
  static constexpr size_t kMaxRetained = 1024;
  static constexpr size_t kMaxRetainedBytes = size_t{8} << 20;

  explicit SessionLedger(int rank) : rank_(rank) {}

  // Numbers `m` (a request batch), records what this rank has received, keeps a copy. Returns
  // whether to send it now (false while the session resumes: it goes out with the re-sent ones).
  bool Prepare(v1::WorkerMessage& m);
  // The session broke (or a send failed): hold new batches until the next session resumes. Lists
  // held out of order are dropped: the coordinator re-sends every list after the last one applied
  // (and a restarted one must not see a list that no rank applied).
  void Lost();
  // What to tell the coordinator when the session opens again.
  void FillResume(v1::RankResume* resume) const;
  // The coordinator has the batches up to `last_request_seq`: the later ones, to send now in order.
  std::vector<v1::WorkerMessage> Resumed(uint64_t last_request_seq);
  // A list from the coordinator: the lists to apply now, in order (none for a duplicate; several
  // when it filled a gap). Acknowledgements it carries forget batches.
  std::vector<v1::ResponseList> Accept(v1::ResponseList list);

  uint64_t last_response_seq() const;
  size_t kept() const;
  size_t retained() const;

 private:
  void ForgetThrough(uint64_t seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int rank_;
  mutable absl::Mutex mu_;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  std::deque<v1::WorkerMessage> kept_ ABSL_GUARDED_BY(mu_);  // unacknowledged, in order
  bool resuming_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t applied_ ABSL_GUARDED_BY(mu_) = 0;                       // last list applied in order
  std::map<uint64_t, v1::ResponseList> held_ ABSL_GUARDED_BY(mu_);  // arrived early
  // Applied and not known to be everyone's, oldest first (without this rank's own part), and
  // their encoded size.
  std::deque<v1::ResponseList> retained_ ABSL_GUARDED_BY(mu_);
  size_t retained_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  void Retain(const v1::ResponseList& list) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ForgetRetainedThrough(uint64_t seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
};

}  // namespace ringmaster
