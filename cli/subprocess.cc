#include "cli/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace ringmaster::cli {
namespace {

// Sleeps in small steps until every child has exited, `deadline` passes or `hurry` says so.
void AwaitExit(const std::vector<Subprocess*>& children, absl::Time deadline,
               const std::function<bool()>& hurry) {
  while (absl::Now() < deadline && !(hurry && hurry())) {
    if (std::all_of(children.begin(), children.end(), [](Subprocess* c) { return c->exited(); })) {
      return;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Start(const std::vector<std::string>& argv,
                                                              Stdout out, std::string name) {
  if (argv.empty()) return absl::InvalidArgumentError("no program to start");
  if (name.empty()) name = argv[0].substr(argv[0].find_last_of('/') + 1);
  // Everything the child needs is prepared before fork: between fork and exec it may only make
  // async-signal-safe calls (other threads may have held locks at the fork).
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull < 0) return absl::ErrnoToStatus(errno, "cannot open /dev/null");
  int out_pipe[2] = {-1, -1};
  int exec_pipe[2] = {-1, -1};  // carries exec's errno; closed by a successful exec (CLOEXEC)
  if ((out == Stdout::kPipe && pipe2(out_pipe, O_CLOEXEC) != 0) ||
      pipe2(exec_pipe, O_CLOEXEC) != 0) {
    const int e = errno;
    for (int fd : {devnull, out_pipe[0], out_pipe[1], exec_pipe[0], exec_pipe[1]}) {
      if (fd >= 0) close(fd);
    }
    return absl::ErrnoToStatus(e, "cannot create a pipe");
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(127);
    setpgid(0, 0);
    // An ignored signal stays ignored across exec (we ignore SIGPIPE); restore the defaults.
    struct sigaction dfl = {};
    dfl.sa_handler = SIG_DFL;
    for (int sig : {SIGPIPE, SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    dup2(devnull, STDIN_FILENO);
    if (out == Stdout::kPipe) dup2(out_pipe[1], STDOUT_FILENO);
    if (out == Stdout::kToStderr) dup2(STDERR_FILENO, STDOUT_FILENO);
    execv(args[0], args.data());
    const int e = errno;
    (void)!write(exec_pipe[1], &e, sizeof e);
    _exit(127);
  }
  const int fork_errno = errno;
  close(devnull);
  close(exec_pipe[1]);
  if (out_pipe[1] >= 0) close(out_pipe[1]);
  if (pid < 0) {
    close(exec_pipe[0]);
    if (out_pipe[0] >= 0) close(out_pipe[0]);
    return absl::ErrnoToStatus(fork_errno, absl::StrCat("cannot start ", name));
  }
  // Also here, so no signal to the group can miss the child before it ran setpgid itself. (EACCES
  // once it has exec'd: it did so already.)
  setpgid(pid, pid);
  int exec_errno = 0;
  ssize_t n;
  do {
    n = read(exec_pipe[0], &exec_errno, sizeof exec_errno);
  } while (n < 0 && errno == EINTR);
  close(exec_pipe[0]);
  if (n == sizeof exec_errno) {
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (out_pipe[0] >= 0) close(out_pipe[0]);
    return absl::ErrnoToStatus(exec_errno, absl::StrCat("cannot run ", argv[0]));
  }
  return std::unique_ptr<Subprocess>(new Subprocess(pid, out_pipe[0], std::move(name)));
}

Subprocess::Subprocess(pid_t pid, int stdout_fd, std::string name)
    : pid_(pid), stdout_fd_(stdout_fd), name_(std::move(name)) {}

Subprocess::~Subprocess() {
  if (!exited()) {
    Signal(SIGKILL);
    const absl::Time deadline = absl::Now() + absl::Seconds(2);
    while (!exited() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  }
  if (stdout_fd_ >= 0) close(stdout_fd_);
}

absl::StatusOr<std::string> Subprocess::ReadLine(absl::Time deadline,
                                                 const std::function<bool()>& stop) {
  if (stdout_fd_ < 0) return absl::FailedPreconditionError("the child's stdout is not a pipe");
  while (true) {
    if (size_t nl = buffered_.find('\n'); nl != std::string::npos) {
      std::string line = buffered_.substr(0, nl);
      buffered_.erase(0, nl + 1);
      return line;
    }
    if (stop && stop()) return absl::CancelledError("interrupted");
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat(name_, " printed no line in time"));
    }
    pollfd p = {stdout_fd_, POLLIN, 0};
    const int timeout_ms =
        static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(left), 1, 100));
    if (poll(&p, 1, timeout_ms) <= 0) continue;  // timeout or EINTR: check stop and the deadline
    char buf[4096];
    const ssize_t n = read(stdout_fd_, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return absl::UnavailableError(absl::StrCat(name_, " closed its stdout"));
    buffered_.append(buf, n);
  }
}

void Subprocess::Signal(int signal) {
  // The group outlives its leader while anything the child started lives on in it.
  kill(-pid_, signal);
}

std::optional<int> Subprocess::Poll() {
  if (wait_status_) return wait_status_;
  int status = 0;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    wait_status_ = status;
  } else if (r < 0 && errno == ECHILD) {
    wait_status_ = 0;  // reaped elsewhere; nothing left to wait for
  }
  return wait_status_;
}

std::string Subprocess::DescribeWaitStatus(int wait_status) {
  if (WIFSIGNALED(wait_status)) {
    const int sig = WTERMSIG(wait_status);
    return absl::StrCat("killed by signal ", sig, " (", strsignal(sig), ")");
  }
  return absl::StrCat("exited with status ", WEXITSTATUS(wait_status));
}

std::vector<std::string> StopAll(const std::vector<Subprocess*>& children, absl::Duration grace,
                                 const std::function<bool()>& hurry) {
  for (Subprocess* c : children) {
    if (!c->exited()) c->Signal(SIGTERM);
  }
  AwaitExit(children, absl::Now() + grace, hurry);
  std::vector<std::string> killed;
  for (Subprocess* c : children) {
    if (!c->exited()) {
      c->Signal(SIGKILL);
      killed.push_back(c->name());
    }
  }
  AwaitExit(children, absl::Now() + absl::Seconds(2), nullptr);
  for (Subprocess* c : children) c->Signal(SIGKILL);
  return killed;
}

}  // namespace ringmaster::cli
