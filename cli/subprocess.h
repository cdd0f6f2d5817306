// A child process that `ringmaster local` starts (the coordinator, the worker daemons). Each child
// leads a process group of its own, so the terminal's Ctrl-C reaches only ringmaster, which then
// stops the children in order, and a signal to the group also reaches what the child started. The
// kernel SIGKILLs the child if the thread that started it dies (PR_SET_PDEATHSIG), so even
// `kill -9 ringmaster` leaves no child behind. stdin is /dev/null.
//
// Not thread-safe: one thread at a time uses an instance. Start it from a thread that outlives it
// (the death signal follows the starting thread, not the process).
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ringmaster::cli {

class Subprocess {
 public:
  enum class Stdout {
    kInherit,   // the child writes to our stdout
    kToStderr,  // the child's stdout goes to our stderr (keeps our stdout for the job's output)
    kPipe,      // read it with ReadLine()
  };

  // Starts argv[0] (a path) with our environment; `name` (default: argv[0]'s base name) is how
  // messages call it. The exec failure is reported here (NOT_FOUND, PERMISSION_DENIED, ... naming
  // the program), not as an exit of the child.
  static absl::StatusOr<std::unique_ptr<Subprocess>> Start(const std::vector<std::string>& argv,
                                                           Stdout out, std::string name = "");
  // SIGKILLs the process group and reaps the child if it still runs.
  ~Subprocess();

  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }

  // The next line of the child's stdout (kPipe), without its newline. DEADLINE_EXCEEDED at
  // `deadline`; CANCELLED when `stop` returns true (checked every 100 ms); UNAVAILABLE when the
  // child closed its stdout (e.g. exited) first.
  absl::StatusOr<std::string> ReadLine(absl::Time deadline,
                                       const std::function<bool()>& stop = nullptr);

  // Sends `signal` to the child's process group (nothing once the group is gone).
  void Signal(int signal);

  // Reaps the child if it exited. Returns its wait status once it has exited, nullopt while it
  // runs.
  std::optional<int> Poll();
  bool exited() { return Poll().has_value(); }

  // "exited with status 3", "killed by signal 9 (Killed)".
  static std::string DescribeWaitStatus(int wait_status);

 private:
  Subprocess(pid_t pid, int stdout_fd, std::string name);

  const pid_t pid_;
  int stdout_fd_;  // -1 unless kPipe
  const std::string name_;
  std::string buffered_;  // read from stdout_fd_ past the last line returned
  std::optional<int> wait_status_;
};

// Sends SIGTERM to every child still running, waits until all have exited or `grace` passed (or
// `hurry` returns true), then SIGKILLs the rest and reaps them (waiting at most 2 s more). Finally
// SIGKILLs every child's process group, for what a child started and left behind. Returns the
// children that needed SIGKILL.
std::vector<std::string> StopAll(const std::vector<Subprocess*>& children, absl::Duration grace,
                                 const std::function<bool()>& hurry = nullptr);

}  // namespace ringmaster::cli
