#include "worker/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/executor.h"

namespace ringmaster {
namespace {

void ReadAll(int fd, int stream, const ChildProcess::OutputFn& output) {
  char buffer[65536];
  while (true) {
    ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (output) output(stream, std::string(buffer, static_cast<size_t>(n)));
  }
  close(fd);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(
    const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
    const std::string& working_dir, OutputFn output) {
  if (argv.empty()) return absl::InvalidArgumentError("the job has no command to run");
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
    return absl::UnavailableError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  // Everything the child needs is prepared before fork: after it, only async-signal-safe calls.
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : env) env_strings.push_back(absl::StrCat(k, "=", v));
  std::vector<char*> envp, args;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& s : argv_copy) args.push_back(s.data());
  args.push_back(nullptr);
  const pid_t parent = getpid();

  // PR_SET_PDEATHSIG fires when the *thread* that forked exits, not the process: a child forked by
  // a short-lived thread (the one that cleaned up the previous job and starts a queued one) would
  // be killed with it. Every child is forked by one thread that lives as long as the daemon.
  static SerialExecutor* const launcher = new SerialExecutor();  // never destroyed
  pid_t pid = -1;
  int fork_errno = 0;
  absl::Notification forked;
  launcher->Post([&] {
    pid = fork();
    if (pid == 0) RunChild(out, err, working_dir, args, envp, parent);  // never returns
    fork_errno = errno;
    forked.Notify();
  });
  forked.WaitForNotification();
  if (pid < 0) return absl::UnavailableError(absl::StrCat("fork: ", std::strerror(fork_errno)));
  setpgid(pid, pid);  // also from the parent, so the group exists before we signal it
  close(out[1]);
  close(err[1]);
  return std::unique_ptr<ChildProcess>(new ChildProcess(pid, out[0], err[0], std::move(output)));
}

// In the forked child: only async-signal-safe calls.
[[noreturn]] void ChildProcess::RunChild(const int out[2], const int err[2],
                                         const std::string& working_dir,
                                         const std::vector<char*>& args,
                                         const std::vector<char*>& envp, pid_t parent) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(137);  // the daemon died before prctl took effect
  dup2(out[1], STDOUT_FILENO);
  dup2(err[1], STDERR_FILENO);
  int devnull = open("/dev/null", O_RDONLY);
  if (devnull >= 0) dup2(devnull, STDIN_FILENO);
  if (!working_dir.empty() && chdir(working_dir.c_str()) != 0) {
    const char msg[] = "ringmaster-worker: cannot change to the job's working directory\n";
    (void)!write(STDERR_FILENO, msg, sizeof(msg) - 1);
    _exit(127);
  }
  execvpe(args[0], args.data(), envp.data());
  const char msg[] = "ringmaster-worker: cannot execute the job's command: ";
  (void)!write(STDERR_FILENO, msg, sizeof(msg) - 1);
  const char* reason = strerror(errno);
  (void)!write(STDERR_FILENO, reason, strlen(reason));
  (void)!write(STDERR_FILENO, "\n", 1);
  _exit(127);
}

ChildProcess::ChildProcess(pid_t pid, int out, int err, OutputFn output) : pid_(pid) {
  out_reader_ = std::thread([out, output] { ReadAll(out, 1, output); });
  err_reader_ = std::thread([err, output] { ReadAll(err, 2, output); });
}

ChildProcess::~ChildProcess() {
  if (!reaped_) {
    kill(-pid_, SIGKILL);
    Wait();
  }
}

ChildExit ChildProcess::Wait() {
  if (reaped_) return exit_;
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  reaped_ = true;
  if (WIFEXITED(status)) {
    exit_.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    exit_.exit_code = 128 + sig;
    exit_.message = absl::StrCat("killed by signal ", sig, " (", strsignal(sig), ")");
  }
  // Whatever the process group still holds dies with the rank.
  kill(-pid_, SIGKILL);
  if (out_reader_.joinable()) out_reader_.join();
  if (err_reader_.joinable()) err_reader_.join();
  return exit_;
}

void ChildProcess::Terminate(absl::Duration grace) {
  if (reaped_) return;
  kill(-pid_, SIGTERM);
  // The thread in Wait() reaps the process as soon as it exits; until then kill(pid, 0) succeeds.
  const absl::Time deadline = absl::Now() + grace;
  while (absl::Now() < deadline && !reaped_ && kill(pid_, 0) == 0) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (!reaped_) kill(-pid_, SIGKILL);
}

}  // namespace ringmaster
