// A training process launched by the daemon: its own process group, killed if the daemon dies
// (PR_SET_PDEATHSIG), stdout and stderr captured through pipes.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ringmaster {

struct ChildExit {
  int exit_code = 0;    // the exit status, or 128 + signal when killed (as shells report it)
  std::string message;  // "" for a normal exit, "killed by signal 9 (Killed)" otherwise
};

class ChildProcess {
 public:
  // Receives output as it is read: stream 1 = stdout, 2 = stderr. Called from reader threads.
  using OutputFn = std::function<void(int stream, std::string data)>;

  // Starts `argv` with exactly `env` in `working_dir` ("" = inherit). INVALID_ARGUMENT for an empty
  // argv; the exec failure itself shows as exit code 127 with the reason on stderr.
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(
      const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
      const std::string& working_dir, OutputFn output);
  ~ChildProcess();  // Kill()s and reaps if still running

  pid_t pid() const { return pid_; }

  // Blocks until the process exits and its output is drained. Call from one thread.
  ChildExit Wait();
  // SIGTERM to the process group, then SIGKILL after `grace` if it is still alive. Another thread
  // must be in Wait() (it reaps the process).
  void Terminate(absl::Duration grace);

 private:
  // The forked child's side: redirects, changes directory, execs; never returns.
  [[noreturn]] static void RunChild(const int out[2], const int err[2],
                                    const std::string& working_dir, const std::vector<char*>& args,
                                    const std::vector<char*>& envp, pid_t parent);

  ChildProcess(pid_t pid, int out, int err, OutputFn output);

  const pid_t pid_;
  std::thread out_reader_;
  std::thread err_reader_;
  std::atomic<bool> reaped_{false};
  ChildExit exit_;
};

}  // namespace ringmaster
