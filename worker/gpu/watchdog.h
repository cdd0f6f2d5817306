// The NCCL watchdog's state machine. NCCL reports a failed peer or network asynchronously
// (ncclCommGetAsyncError), and a collective whose peer died may never finish; a blocking
// ncclCommDestroy would then hang too. The watchdog polls the communicator, bounds every collective
// by a deadline, and on the first of
//   - an asynchronous error,
//   - a collective running past its deadline,
//   - the coordinator reporting a peer lost (the job is stopping),
// aborts the communicator exactly once (ncclCommAbort, never a blocking destroy), stops touching
// it, and from then on fails every operation with the same status, naming this rank and host.
// `on_fail` (to report to the coordinator) runs once, outside the lock, for a failure the watchdog
// detected (an asynchronous error or a deadline), not for an abort it was told to do (PeerLost: the
// coordinator knows already).
//
// Transport-free: the communicator is an interface (NcclCommunicator implements it; tests use a
// fake) and times are passed in. Thread-safe: the engine thread starts and finishes operations, a
// watchdog thread calls Check().
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ringmaster {

// What the watchdog needs of a communicator.
class WatchedCommunicator {
 public:
  virtual ~WatchedCommunicator() = default;
  // OK while healthy; the asynchronous error, converted, otherwise. Never called after Abort().
  virtual absl::Status AsyncError() = 0;
  // Aborts the communicator (ncclCommAbort): pending collectives return, nothing blocks.
  virtual void Abort() = 0;
};

class Watchdog {
 public:
  enum class State { kHealthy, kAborted };

  // `where` names this rank in errors, e.g. "rank 3 (host-b, cuda:1)".
  Watchdog(WatchedCommunicator* communicator, std::string where, absl::Duration op_timeout,
           std::function<void(const absl::Status&)> on_fail = nullptr);

  // A collective was enqueued at `now` (one at a time per communicator). FAILED_PRECONDITION with
  // the original failure once aborted: the engine must not enqueue on an aborted communicator.
  absl::Status OpStarted(const std::string& what, absl::Time now);
  // The collective in flight completed.
  void OpFinished();

  // Polls the communicator and the deadline; aborts on failure. Returns the failure when this call
  // detected it (once), nullopt otherwise.
  std::optional<absl::Status> Check(absl::Time now);

  // The coordinator says a peer is gone (or the job stopped): abort with `why`.
  void PeerLost(const std::string& why);

  // Runs `use` (a call on the communicator) unless it has been aborted, never concurrently with the
  // abort; returns whether it ran. Every call on the communicator from other code goes through it.
  bool WithCommunicator(const std::function<void()>& use);

  State state() const;
  // OK while healthy; the failure after.
  absl::Status failure() const;

 private:
  // Aborts with `status` unless already aborted (then calls on_fail_ if `report`); returns whether
  // it did.
  bool Fail(absl::Status status, bool report) ABSL_LOCKS_EXCLUDED(mu_);

  WatchedCommunicator* const communicator_;
  const std::string where_;
  const absl::Duration op_timeout_;
  const std::function<void(const absl::Status&)> on_fail_;

  mutable absl::Mutex mu_;
  // Serialises the abort with polls, so AsyncError() is never called on an aborted communicator.
  absl::Mutex comm_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  State state_ ABSL_GUARDED_BY(mu_) = State::kHealthy;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  std::string op_ ABSL_GUARDED_BY(mu_);  // the collective in flight, or empty
  absl::Time op_started_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ringmaster
