// Which training process is attached to a rank. One process per rank: a second would share the
// rank's arena (and, on a GPU, replace its ready events). The process may hold several
// connections at once (it may reconnect before its old connection's end is seen).
//
// Thread-safe: one mutex; Admit() runs the welcome under it, so a Close() (the rank's arena is
// going) cannot come between the check and the welcome's use of the arena.
#pragma once

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ringmaster {

class RankAttachment {
 public:
  // Admits a connection of process `pid` (-1: not known) and runs `welcome`. A process other
  // than the attached one first waits up to `settle` for the attached one's connections to be
  // seen ending (a process that has just exited, the previous command of `sh -c "a && b"`).
  // UNAVAILABLE once closed; FAILED_PRECONDITION naming `who` (the rank) and the attached pid while
  // another process stays attached; `welcome`'s error, with nothing admitted, if it fails.
  absl::Status Admit(int pid, const std::string& who, absl::Duration settle,
                     absl::FunctionRef<absl::Status()> welcome);
  // A connection admitted before ended. True when it was the process's last: it is detached.
  bool Leave();
  // No admission from now on.
  void Close();
  // The attached process's pid: 0 when none, -1 when not known.
  int pid() const;
  int connections() const;

 private:
  bool OtherAttached(int pid) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  int pid_ ABSL_GUARDED_BY(mu_) = 0;
  int connections_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ringmaster
