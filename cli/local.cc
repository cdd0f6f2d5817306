#include "cli/local.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/artifacts.h"
#include "cli/job_flags.h"
#include "cli/log_printer.h"
#include "cli/subprocess.h"
#include "ringmaster/v1/job.grpc.pb.h"

namespace ringmaster::cli {
namespace {

namespace v1 = ringmaster::v1;

// Set by SIGINT, SIGTERM and SIGHUP: the first signal, and how many arrived (a second one skips the
// grace period of the shutdown). Lock-free atomics are async-signal-safe.
std::atomic<int> g_signal{0};
std::atomic<int> g_signals{0};

void OnSignal(int sig) {
  int none = 0;
  g_signal.compare_exchange_strong(none, sig);
  g_signals.fetch_add(1);
}

bool Interrupted() { return g_signal.load() != 0; }

std::string SignalName(int sig) {
  switch (sig) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
  }
  return absl::StrCat("signal ", sig);
}

std::string StateName(v1::JobState state) {
  std::string name = v1::JobState_Name(state);
  return absl::StartsWith(name, "JOB_STATE_") ? name.substr(10) : name;
}

bool IsTerminal(v1::JobState s) {
  return s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED || s == v1::JOB_STATE_CANCELLED;
}

// Whether process `pid` is gone (one of another user's is alive for us: EPERM).
bool ProcessGone(int pid) { return pid > 0 && kill(pid, 0) != 0 && errno == ESRCH; }

// What a `ringmaster local` killed with SIGKILL (or a daemon of it) left in `tmp`: its sockets,
// its coordinator's artifacts directory and its ranks' directories, each named after a process
// that is gone. Returns how many entries went. Errors are ignored: a stale entry is only litter.
int RemoveLeftovers(const std::filesystem::path& tmp) {
  namespace fs = std::filesystem;
  int removed = 0;
  std::error_code error;
  auto remove = [&](const fs::path& path) {
    if (fs::remove_all(path, error) > 0) ++removed;
  };
  // "<digits>" at the front of `text`, or -1.
  auto leading_pid = [](absl::string_view text) {
    const size_t end = text.find_first_not_of("0123456789");
    int pid = -1;
    if (end == 0 || !absl::SimpleAtoi(text.substr(0, end), &pid)) return -1;
    return pid;
  };
  for (const fs::directory_entry& e : fs::directory_iterator(tmp, error)) {
    const std::string name = e.path().filename().string();
    absl::string_view rest = name;
    if (absl::ConsumePrefix(&rest, "ringmaster-local-")) {
      // ringmaster-local-<pid>-artifacts
      if (absl::EndsWith(rest, "-artifacts") && ProcessGone(leading_pid(rest))) remove(e.path());
    } else if (absl::ConsumePrefix(&rest, "ringmaster-ranks-")) {
      // ringmaster-ranks-<uid>/<job>-<epoch>-rank-<r>-<daemon pid>
      if (rest != absl::StrCat(getuid())) continue;
      for (const fs::directory_entry& rank : fs::directory_iterator(e.path(), error)) {
        const std::string dir = rank.path().filename().string();
        const size_t dash = dir.rfind('-');
        if (dir.find("-rank-") == std::string::npos || dash == std::string::npos) continue;
        const int pid = leading_pid(absl::string_view(dir).substr(dash + 1));
        if (pid > 0 && absl::string_view(dir).substr(dash + 1) == absl::StrCat(pid) &&
            ProcessGone(pid)) {
          remove(rank.path());
        }
      }
    } else if (absl::ConsumePrefix(&rest, "ringmaster-") &&
               (absl::EndsWith(rest, ".sock") || absl::EndsWith(rest, ".sock.lock"))) {
      // ringmaster-<pid>-coordinator.sock, ringmaster-<pid>-<i>.sock[.lock]
      const int pid = leading_pid(rest);
      if (pid > 0 && rest.substr(absl::StrCat(pid).size()).front() == '-' && ProcessGone(pid)) {
        remove(e.path());
      }
    }
  }
  return removed;
}

constexpr char kPortLine[] = "ringmaster-coordinator listening on port ";
// How long the coordinator has to fail a job whose worker daemon died (its reconnect grace, 2 s,
// and the failure's settling) before `ringmaster local` cancels it.
constexpr absl::Duration kWorkerLossSettle = absl::Seconds(4);
constexpr absl::Duration kCoordinatorStartTimeout = absl::Seconds(10);
constexpr absl::Duration kStopGrace = absl::Seconds(5);
constexpr absl::Duration kCallTimeout = absl::Seconds(5);

struct LocalOptions {
  int32_t np = 0;
  int32_t per_host = 0;
  int port = 0;
  absl::Duration start_timeout = absl::Seconds(60);
  // > 0: the coordinator serves metrics on this port and worker i on metrics_port_base + 1 + i.
  int metrics_port_base = 0;
  // Where the job's artifacts go when it ends.
  std::string artifacts_output = ".";
  // Artifacts asked for as a path (--timeline /tmp/run/timeline.json): name -> that path.
  std::map<std::string, std::string> artifact_paths;
  // Worker i serves cuda:(i mod processes-per-host) instead of the CPU.
  bool gpus = false;
  int arena_mb = 0;  // the workers' --arena-mb; 0: theirs
};

// One run: the processes it started, the job, and the thread that watches both.
class LocalRun {
 public:
  LocalRun(const Global& g, LocalOptions options, v1::JobSpec spec, std::string bin_dir)
      : g_(g), options_(options), spec_(std::move(spec)), bin_dir_(std::move(bin_dir)) {}
  ~LocalRun() { Stop(); }

  int Run() {
    if (const int removed = RemoveLeftovers(std::filesystem::temp_directory_path()); removed > 0) {
      std::fprintf(stderr,
                   "ringmaster local: removed %d sockets and directories left in %s by runs "
                   "that were killed\n",
                   removed, std::filesystem::temp_directory_path().c_str());
    }
    if (absl::Status s = StartCoordinator(); !s.ok()) return Error(s);
    if (absl::Status s = StartWorkers(); !s.ok()) return Error(s);
    // No gRPC channel before the children are forked: they exec at once, but gRPC's threads
    // should not be running at a fork.
    stub_ = v1::JobService::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port_), grpc::InsecureChannelCredentials()));
    if (absl::Status s = RegisterJob(); !s.ok()) return Error(s);

    std::thread monitor([this] { Monitor(); });
    const grpc::Status followed = FollowLogs();
    monitor_done_.Notify();
    monitor.join();

    absl::StatusOr<v1::Job> job = GetJob();
    if (job.ok()) SaveArtifacts();
    Stop();
    if (g_.json && job.ok()) std::printf("%s\n", Json(*job).c_str());
    std::fflush(stdout);
    if (job.ok() && job->state() == v1::JOB_STATE_SUCCEEDED) return 0;
    if (job.ok() && IsTerminal(job->state())) {
      // The reason with a failed rank's last lines (a rank killed by a signal says nothing of
      // its own), but not how to see the rest with a coordinator that is gone when we exit.
      const std::string& reason = job->reason();
      std::fprintf(stderr, "ringmaster local: job %s: %s\n", StateName(job->state()).c_str(),
                   reason.substr(0, reason.find("\nsee all of it with: ")).c_str());
      const int sig = g_signal.load();
      return sig != 0 ? 128 + sig : 1;
    }
    // The job did not end (the coordinator is gone, or the stream was cut): say why we stopped.
    std::string why = stop_reason_;
    if (why.empty()) why = followed.ok() ? "the log stream ended early" : Describe(followed);
    if (!job.ok()) absl::StrAppend(&why, " (", job.status().ToString(), ")");
    std::fprintf(stderr, "ringmaster local: %s\n", why.c_str());
    const int sig = g_signal.load();
    return sig != 0 ? 128 + sig : 1;
  }

 private:
  int Error(const absl::Status& s) {
    Stop();
    std::fprintf(stderr, "ringmaster local: %s\n", std::string(s.message()).c_str());
    const int sig = g_signal.load();
    return sig != 0 ? 128 + sig : 1;
  }

  absl::Status StartCoordinator() {
    // The daemons reach it through a Unix socket (a negotiation round trip costs less than over
    // loopback TCP); this command and the training processes' tools use the port.
    coordinator_socket_ = absl::StrCat("/tmp/ringmaster-", getpid(), "-coordinator.sock");
    std::vector<std::string> argv = {absl::StrCat(bin_dir_, "/ringmaster-coordinator"), "--listen",
                                     absl::StrCat("127.0.0.1:", options_.port), "--listen-unix",
                                     coordinator_socket_, "--artifacts-dir", artifacts_dir_,
                                     // Loopback only, one user's run: no TLS, even when the
                                     // environment names certificates for another coordinator.
                                     "--insecure"};
    if (options_.metrics_port_base > 0) {
      argv.insert(argv.end(),
                  {"--metrics-listen", absl::StrCat("127.0.0.1:", options_.metrics_port_base)});
      std::fprintf(stderr, "ringmaster local: coordinator metrics at http://127.0.0.1:%d/metrics\n",
                   options_.metrics_port_base);
    }
    // Its warnings (a job failed, ...) would repeat what we print; HOROVOD_LOG_LEVEL still rules.
    if (std::getenv("HOROVOD_LOG_LEVEL") == nullptr) {
      argv.insert(argv.end(), {"--log-level", "error"});
    }
    absl::StatusOr<std::unique_ptr<Subprocess>> c =
        Subprocess::Start(argv, Subprocess::Stdout::kPipe);
    if (!c.ok()) return c.status();
    coordinator_ = *std::move(c);
    const absl::Time deadline = absl::Now() + kCoordinatorStartTimeout;
    while (true) {
      absl::StatusOr<std::string> line = coordinator_->ReadLine(deadline, Interrupted);
      if (!line.ok()) {
        if (Interrupted()) {
          return absl::CancelledError(absl::StrCat("interrupted by ", SignalName(g_signal)));
        }
        if (absl::IsUnavailable(line.status())) {
          // Give it a moment to be reaped, so the message can say how it exited.
          const absl::Time reap = absl::Now() + absl::Seconds(1);
          while (!coordinator_->exited() && absl::Now() < reap) {
            absl::SleepFor(absl::Milliseconds(5));
          }
          if (std::optional<int> status = coordinator_->Poll()) {
            return absl::UnavailableError(absl::StrCat("ringmaster-coordinator ",
                                                       Subprocess::DescribeWaitStatus(*status),
                                                       " before listening"));
          }
        }
        return absl::UnavailableError(absl::StrCat(
            "ringmaster-coordinator did not report its port within ",
            absl::FormatDuration(kCoordinatorStartTimeout), ": ", line.status().message()));
      }
      if (absl::StartsWith(*line, kPortLine) &&
          absl::SimpleAtoi(line->substr(sizeof(kPortLine) - 1), &port_) && port_ > 0) {
        return absl::OkStatus();
      }
    }
  }

  absl::Status StartWorkers() {
    const std::string worker = absl::StrCat(bin_dir_, "/ringmaster-worker");
    for (int i = 0; i < options_.np; ++i) {
      if (Interrupted()) {
        return absl::CancelledError(absl::StrCat("interrupted by ", SignalName(g_signal)));
      }
      const std::string host = absl::StrCat("local-", i / options_.per_host);
      sockets_.push_back(absl::StrCat("/tmp/ringmaster-", getpid(), "-", i, ".sock"));
      // The worker's own stdout goes to our stderr: our stdout carries only the job's output.
      std::vector<std::string> argv = {
          worker, "--coordinator", absl::StrCat("unix:", coordinator_socket_), "--device",
          // --gpus: one GPU per rank of a simulated host.
          options_.gpus ? absl::StrCat("cuda:", i % options_.per_host) : std::string("cpu"),
          "--host-name", host, "--socket", sockets_.back(), "--insecure"};
      if (options_.arena_mb > 0) {
        argv.insert(argv.end(), {"--arena-mb", absl::StrCat(options_.arena_mb)});
      }
      if (options_.metrics_port_base > 0) {
        const int metrics_port = options_.metrics_port_base + 1 + i;
        argv.insert(argv.end(), {"--metrics-listen", absl::StrCat("127.0.0.1:", metrics_port)});
        std::fprintf(stderr, "ringmaster local: worker %d metrics at http://127.0.0.1:%d/metrics\n",
                     i, metrics_port);
      }
      absl::StatusOr<std::unique_ptr<Subprocess>> w = Subprocess::Start(
          argv, Subprocess::Stdout::kToStderr, absl::StrCat("ringmaster-worker ", i, " on ", host));
      if (!w.ok()) return w.status();
      workers_.push_back(*std::move(w));
    }
    return absl::OkStatus();
  }

  absl::Status RegisterJob() {
    v1::RegisterJobRequest request;
    *request.mutable_spec() = spec_;
    v1::RegisterJobResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(g_.timeout_seconds)));
    context.set_wait_for_ready(true);  // the coordinator listens already; ride out a slow connect
    grpc::Status s = stub_->RegisterJob(&context, request, &response);
    if (!s.ok()) return absl::Status(static_cast<absl::StatusCode>(s.error_code()), Describe(s));
    job_id_ = response.job().id();
    return absl::OkStatus();
  }

  // Prints the job's output until the job has ended and all of it was delivered, or the monitor
  // cuts the stream.
  grpc::Status FollowLogs() {
    v1::GetLogsRequest request;
    request.set_job_id(job_id_);
    request.set_all_ranks(true);
    request.set_follow(true);
    // No deadline: the stream lasts as long as the job.
    auto reader = stub_->GetLogs(follow_context_.get(), request);
    return PrintLogs(*reader, /*prefix_ranks=*/true, g_.json);
  }

  // Runs beside FollowLogs(). Ends the job when ringmaster is interrupted, when a child dies, or
  // when the workers do not all connect in time; cuts the log stream if the job does not end
  // within kCallTimeout after that (or at once when the coordinator itself is gone).
  void Monitor() {
    const absl::Time start_deadline = absl::Now() + options_.start_timeout;
    absl::Time next_check = absl::Now();
    absl::Time cut_at = absl::InfiniteFuture();
    bool started = false;
    while (!monitor_done_.WaitForNotificationWithTimeout(absl::Milliseconds(50))) {
      const absl::Time now = absl::Now();
      if (stop_reason_.empty()) {
        if (const int sig = g_signal.load(); sig != 0) {
          stop_reason_ = absl::StrCat("interrupted by ", SignalName(sig));
        }
        for (auto& w : workers_) {
          if (std::optional<int> status = w->Poll(); status && worker_died_.empty()) {
            // The coordinator sees the daemon's session break and fails the job itself, naming
            // the rank it served (after the reconnect grace); cancelled only if it has not.
            worker_died_ = absl::StrCat(w->name(), " (pid ", w->pid(), ") ",
                                        Subprocess::DescribeWaitStatus(*status));
            worker_died_deadline_ = now + kWorkerLossSettle;
          }
        }
        if (!worker_died_.empty() && now >= worker_died_deadline_) stop_reason_ = worker_died_;
        if (std::optional<int> status = coordinator_->Poll(); status && stop_reason_.empty()) {
          stop_reason_ = absl::StrCat("ringmaster-coordinator (pid ", coordinator_->pid(), ") ",
                                      Subprocess::DescribeWaitStatus(*status));
        }
        if (started && stop_reason_.empty() && now >= next_check) {
          next_check = now + absl::Seconds(2);
          if (absl::StatusOr<v1::Job> job = GetJob(); job.ok()) PrintWarnings(*job);
        }
        if (!started && stop_reason_.empty() && now >= next_check) {
          next_check = now + absl::Milliseconds(500);
          absl::StatusOr<v1::Job> job = GetJob();
          if (job.ok() && job->state() != v1::JOB_STATE_PENDING) {
            started = true;
          } else if (now >= start_deadline) {
            stop_reason_ = absl::StrCat("the ", options_.np, " workers did not all connect within ",
                                        absl::FormatDuration(options_.start_timeout));
          }
        }
        if (!stop_reason_.empty()) {
          if (coordinator_->exited()) {
            cut_at = now;
          } else {
            CancelJob(stop_reason_);
            cut_at = absl::Now() + kCallTimeout;
          }
        }
      }
      if (absl::Now() >= cut_at) {
        follow_context_->TryCancel();
        cut_at = absl::InfiniteFuture();
      }
    }
  }

  // The job's events that warn of trouble while it runs (a stall report names the ranks that
  // have not submitted a tensor), each printed once: `status` is not the only place to see them.
  void PrintWarnings(const v1::Job& job) {
    for (const v1::JobEvent& e : job.events()) {
      if (e.time_unix_ms() < warned_until_ms_ ||
          !absl::StartsWith(e.message(), "Stalled collectives")) {
        continue;
      }
      warned_until_ms_ = e.time_unix_ms() + 1;
      std::fprintf(stderr, "ringmaster local: warning: %s\n", e.message().c_str());
    }
  }

  void CancelJob(const std::string& reason) {
    v1::CancelJobRequest request;
    request.set_job_id(job_id_);
    request.set_reason(reason);
    v1::CancelJobResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
    // FAILED_PRECONDITION when the job ended meanwhile: nothing to do.
    (void)stub_->CancelJob(&context, request, &response);
  }

  absl::StatusOr<v1::Job> GetJob() {
    v1::GetJobRequest request;
    request.set_job_id(job_id_);
    v1::GetJobResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
    grpc::Status s = stub_->GetJob(&context, request, &response);
    if (!s.ok()) return absl::Status(static_cast<absl::StatusCode>(s.error_code()), Describe(s));
    return response.job();
  }

  // Copies the job's artifacts out of the coordinator's private directory.
  void SaveArtifacts() {
    std::vector<FetchedArtifact> fetched;
    grpc::Status s = FetchArtifacts(*stub_, g_, job_id_, options_.artifacts_output, &fetched);
    if (!s.ok()) {
      std::fprintf(stderr, "ringmaster local: could not save the job's artifacts: %s\n",
                   Describe(s).c_str());
    }
    for (FetchedArtifact& f : fetched) {
      if (auto it = options_.artifact_paths.find(f.name); it != options_.artifact_paths.end()) {
        std::error_code error;
        std::filesystem::rename(f.path, it->second, error);
        if (error) {  // another file system: copy
          std::filesystem::copy_file(f.path, it->second,
                                     std::filesystem::copy_options::overwrite_existing, error);
          if (!error) std::filesystem::remove(f.path, error);
        }
        if (!error) {
          f.path = it->second;
        } else {
          std::fprintf(stderr, "ringmaster local: could not write %s: %s\n", it->second.c_str(),
                       error.message().c_str());
        }
      }
      std::fprintf(stderr, "ringmaster local: %s written to %s (%lld bytes)\n", f.name.c_str(),
                   f.path.c_str(), static_cast<long long>(f.size_bytes));
    }
  }

  // Stops the workers, then the coordinator (SIGTERM, SIGKILL after kStopGrace each, sooner after
  // a second Ctrl-C), and removes the workers' sockets. Idempotent. REQUIRES: the monitor thread
  // is not running.
  void Stop() {
    if (stopped_) return;
    stopped_ = true;
    // Close our connection first: while an idle channel of ours stays open, the coordinator's
    // graceful stop waits out its whole grace period (observed; a client that does not poll its
    // channel does not answer the server's shutdown handshake).
    follow_context_.reset();
    stub_.reset();
    auto hurry = [] { return g_signals.load() > 1; };
    std::vector<Subprocess*> workers;
    for (auto& w : workers_) workers.push_back(w.get());
    std::vector<std::string> killed = StopAll(workers, kStopGrace, hurry);
    if (coordinator_ != nullptr) {
      for (std::string& name : StopAll({coordinator_.get()}, kStopGrace, hurry)) {
        killed.push_back(std::move(name));
      }
    }
    for (const std::string& name : killed) {
      std::fprintf(stderr, "ringmaster local: %s did not stop on SIGTERM; killed it\n",
                   name.c_str());
    }
    if (!coordinator_socket_.empty()) unlink(coordinator_socket_.c_str());  // if it was killed
    for (const std::string& path : sockets_) {
      unlink(path.c_str());
      unlink(absl::StrCat(path, ".lock").c_str());  // a killed worker's claim on it
    }
    std::error_code error;
    std::filesystem::remove_all(artifacts_dir_, error);
  }

  const Global& g_;
  const LocalOptions options_;
  const v1::JobSpec spec_;
  const std::string bin_dir_;
  std::unique_ptr<Subprocess> coordinator_;
  std::vector<std::unique_ptr<Subprocess>> workers_;
  std::string coordinator_socket_;  // the coordinator's --listen-unix
  std::vector<std::string> sockets_;
  int port_ = 0;
  std::unique_ptr<v1::JobService::Stub> stub_;  // its channel is our only connection
  std::string job_id_;
  // The coordinator's artifacts, private to this run.
  const std::string artifacts_dir_ = absl::StrCat(std::filesystem::temp_directory_path().string(),
                                                  "/ringmaster-local-", getpid(), "-artifacts");
  // The log stream's; the monitor thread cancels the stream through it.
  std::unique_ptr<grpc::ClientContext> follow_context_ = std::make_unique<grpc::ClientContext>();
  int64_t warned_until_ms_ = 0;  // events before this were printed (Monitor's thread)
  // A worker daemon that died (Monitor's thread), and when the job is cancelled if the
  // coordinator has not ended it by then.
  std::string worker_died_;
  absl::Time worker_died_deadline_ = absl::InfiniteFuture();
  absl::Notification monitor_done_;
  // Written by the monitor thread, read by Run() after joining it.
  std::string stop_reason_;
  bool stopped_ = false;
};

}  // namespace

int Local(const Global& g, Args& args) {
  LocalOptions options;
  std::map<std::string, std::string> requested_paths;
  v1::JobSpec spec = ParseJobSpec(
      "local", args,
      [&](const std::string& flag, Args& a) {
        if (flag == "--coordinator-port") {
          options.port = Number<int>(flag, a.Value(flag));
          if (options.port < 0 || options.port > 65535) {
            Usage(
                absl::StrCat("--coordinator-port ", options.port, " is out of bounds [0, 65535]"));
          }
          return true;
        }
        if (flag == "--metrics-port-base") {
          options.metrics_port_base = Number<int>(flag, a.Value(flag));
          if (options.metrics_port_base < 1 || options.metrics_port_base > 65535 - 4097) {
            Usage(absl::StrCat("--metrics-port-base ", options.metrics_port_base,
                               " is out of bounds [1, 61438]"));
          }
          return true;
        }
        if (flag == "--gpus") {
          options.gpus = true;
          return true;
        }
        if (flag == "--arena-mb") {
          options.arena_mb = Number<int>(flag, a.Value(flag));
          if (options.arena_mb < 16 || options.arena_mb > 1 << 20) {
            Usage(absl::StrCat("--arena-mb ", options.arena_mb, " is out of bounds [16, 1048576]"));
          }
          return true;
        }
        if (flag == "--artifacts-output") {
          options.artifacts_output = a.Value(flag);
          return true;
        }
        if (flag == "--start-timeout-seconds") {
          const double s = Number<double>(flag, a.Value(flag));
          if (!(s > 0)) Usage("--start-timeout-seconds must be positive");
          options.start_timeout = absl::Milliseconds(s * 1000);
          return true;
        }
        return false;
      },
      &requested_paths);
  if (spec.command().empty()) {
    Usage("local needs a command: ringmaster local --np N -- CMD ARGS...");
  }
  // An elastic job (--min-np/--max-np) without --np: as many workers as it may use.
  if (spec.np() == 0 && (spec.min_np() > 0 || spec.max_np() > 0)) {
    spec.set_np(spec.max_np() > 0 ? spec.max_np() : spec.min_np());
  }
  // Checked here, before any process starts (the coordinator checks the rest of the spec).
  if (spec.np() < 1 || spec.np() > 4096) {
    Usage(absl::StrCat("--np ", spec.np(), " is out of bounds [1, 4096]"));
  }
  const int32_t most = std::max(spec.np(), spec.max_np());
  if (spec.processes_per_host() == 0) spec.set_processes_per_host(most);  // one host
  if (spec.processes_per_host() < 1 || spec.processes_per_host() > most) {
    Usage(absl::StrCat("--processes-per-host ", spec.processes_per_host(), " is out of bounds [1, ",
                       most, "]"));
  }
  options.artifact_paths = std::move(requested_paths);
  options.np = spec.np();
  options.per_host = spec.processes_per_host();
  if (spec.working_dir().empty()) {
    std::error_code error;
    spec.set_working_dir(std::filesystem::current_path(error).string());
  }
  const std::string bin_dir = ExecutableDir();
  InheritCallerEnvironment(bin_dir, &spec);
  for (const char* binary : {"ringmaster-coordinator", "ringmaster-worker"}) {
    const std::string path = absl::StrCat(bin_dir, "/", binary);
    if (access(path.c_str(), X_OK) != 0) {
      std::fprintf(stderr, "ringmaster local: %s not found next to ringmaster (in %s)\n", binary,
                   bin_dir.c_str());
      return 1;
    }
  }

  // Until the run is over, these signals stop it in order instead of killing ringmaster outright.
  // Without SA_RESTART, so a blocking call returns and the flag is seen.
  struct sigaction on_signal = {};
  on_signal.sa_handler = OnSignal;
  sigemptyset(&on_signal.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &on_signal, nullptr);
  // Output to a closed pipe (`ringmaster local ... | head`) must not kill us before we stop the
  // children; the children get SIGPIPE's default back.
  signal(SIGPIPE, SIG_IGN);

  LocalRun run(g, options, std::move(spec), bin_dir);
  return run.Run();
}

}  // namespace ringmaster::cli
