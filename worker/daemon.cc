#include "worker/daemon.h"

#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "spdlog/spdlog.h"
#ifdef RINGMASTER_HAVE_NCCL
#include "worker/gpu/plugin.h"
#endif

namespace ringmaster {
namespace {

std::string DefaultHostName() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

}  // namespace

Daemon::Daemon(DaemonOptions options) : options_(std::move(options)) {}

Daemon::~Daemon() {
  Shutdown();
  metrics_server_.reset();  // its probes read session_, destroyed before it otherwise
  if (session_) session_->Stop();
  if (local_) local_->Stop();
  finishers_.JoinAll();
}

absl::Status Daemon::Start() {
  if (absl::Status s = Configure(); !s.ok()) return s;
  if (absl::Status s = OpenDevice(); !s.ok()) return s;
  if (absl::Status s = StartMetrics(); !s.ok()) return s;
  local_api_ = std::make_unique<LocalApi>(
      LocalApi::Options{
          .attach_uids = options_.attach_uids,
          .send = [this](const v1::WorkerMessage& m) { return session_->Send(m); },
      },
      *this);
  absl::StatusOr<std::unique_ptr<LocalServer>> local =
      LocalServer::Start(options_.socket_path, local_api_.get(),
                         SocketAccess{.mode = 0660, .group = options_.socket_group});
  if (!local.ok()) return local.status();
  local_ = *std::move(local);
  if (absl::Status s = StartSession(); !s.ok()) return s;
  spdlog::info("worker on {} ({}) serving {}", options_.host_name, options_.device,
               options_.socket_path);
  return absl::OkStatus();
}

absl::Status Daemon::Configure() {
  DaemonOptions& o = const_cast<DaemonOptions&>(options_);
  if (o.host_name.empty()) o.host_name = DefaultHostName();
  if (o.socket_path.empty()) {
    o.socket_path = absl::StrCat("/tmp/ringmaster-worker-", getpid(), ".sock");
  }
  if (o.work_dir.empty()) {
    const char* tmp = getenv("TMPDIR");
    o.work_dir =
        absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/ringmaster-ranks-", getuid());
  }
  if (!options_.iface.empty()) {
    if (absl::StatusOr<LocalAddress> a = AddressOfInterface(options_.iface); !a.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--iface: ", a.status().message()));
    }
  }
  if (const char* skew = getenv("RINGMASTER_FAULT_CLOCK_OFFSET_SECONDS"); skew != nullptr) {
    double seconds = 0;
    if (absl::SimpleAtod(skew, &seconds) && seconds != 0) {
      wall_clock_offset_ = absl::Seconds(seconds);
      spdlog::warn(
          "fault injection: the wall-clock times this worker reports are {} off "
          "(RINGMASTER_FAULT_CLOCK_OFFSET_SECONDS)",
          absl::FormatDuration(wall_clock_offset_));
    }
  }
  absl::StatusOr<LocalAddress> address = DataAddress();
  if (address.ok()) {
    // NCCL picks its bootstrap interface itself: point it at the same one, exactly ("=" keeps
    // "eth1" from also matching "eth10"), unless the operator chose. Set before any other thread
    // of this daemon starts, the CUDA runtime's included (setenv is not safe against a concurrent
    // getenv).
    if (getenv("NCCL_SOCKET_IFNAME") == nullptr && !address->iface.empty()) {
      setenv("NCCL_SOCKET_IFNAME", absl::StrCat("=", address->iface).c_str(), 1);
    }
    spdlog::info("data plane on {} ({})", address->address, address->iface);
  } else {
    spdlog::warn("data plane address not known yet (found again at the first job): {}",
                 address.status().ToString());
  }
  return absl::OkStatus();
}

absl::Status Daemon::OpenDevice() {
  if (options_.device == "cpu") return absl::OkStatus();
  int ordinal = -1;
  if (!absl::StartsWith(options_.device, "cuda:") ||
      !absl::SimpleAtoi(options_.device.substr(5), &ordinal) || ordinal < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device '", options_.device, "' is not cpu or cuda:N"));
  }
#ifdef RINGMASTER_HAVE_NCCL
  // An absent or busy GPU (or a machine without CUDA's libraries) is refused here, at start, with
  // the reason.
  absl::StatusOr<const GpuPlugin*> plugin = LoadGpuPlugin();
  if (!plugin.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--device ", options_.device, ": ", plugin.status().message()));
  }
  gpu_plugin_ = *plugin;
  if (absl::Status s = gpu_plugin_->check_device(ordinal); !s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--device ", options_.device, ": ", s.message()));
  }
  cuda_device_ = ordinal;
  return absl::OkStatus();
#else
  return absl::FailedPreconditionError(absl::StrCat(
      "--device ", options_.device,
      ": this build has no CUDA/NCCL (configure with the CUDA toolkit and NCCL installed)"));
#endif
}

absl::Status Daemon::StartMetrics() {
  if (options_.metrics_listen.empty()) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<MetricsServer>> metrics = MetricsServer::Start(
      options_.metrics_listen, &metrics_,
      HealthChecks{
          .live = nullptr,
          // Ready while its session with the coordinator is open: it can be given a rank.
          .ready =
              [this] {
                if (!session_started_.load()) return absl::UnavailableError("starting");
                if (session_->connected()) return absl::OkStatus();
                return absl::UnavailableError(
                    absl::StrCat("not connected to the coordinator at ", channel_->Describe()));
              },
      });
  if (!metrics.ok()) return metrics.status();
  metrics_server_ = *std::move(metrics);
  return absl::OkStatus();
}

absl::Status Daemon::StartSession() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  // gRPC's own reconnect backoff (1 s growing to 120 s) would hold a worker back long after a
  // coordinator (re)started: the channel tries again at least every second, and the session, which
  // waits for it to connect (up to its backoff, 100 ms doubling to 5 s), goes on as soon as it
  // does. A restarted coordinator thus has its daemons back within about a second.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // Keepalive: a connection whose peer went silent (a host gone, a NAT that forgot it) is found
  // dead within about 15 s even while nothing is sent, and the session reconnects.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10'000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5'000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  absl::StatusOr<std::unique_ptr<CoordinatorChannels>> channels =
      CoordinatorChannels::Create(options_.coordinator, MakeChannelCredentials(options_.tls), args);
  if (!channels.ok()) return channels.status();
  channel_ = *std::move(channels);
  v1::RegisterWorkerRequest registration;
  registration.set_host(options_.host_name);
  registration.set_device(options_.device);
  {
    absl::MutexLock lock(&mu_);
    if (data_address_.has_value()) registration.set_address(data_address_->address);
  }
  registration.set_slot(options_.socket_path);  // kept across restarts: a restart replaces it
  session_ = std::make_unique<CoordinatorSession>(channel_, registration, this);
  session_->Start();
  session_started_.store(true);
  return absl::OkStatus();
}

WorkerContext Daemon::Context() {
  return WorkerContext{
      .options = &options_,
      .channel = channel_,
      .session = session_.get(),
      .metrics = &metrics_,
      .cuda_device = cuda_device_,
      .gpu_plugin = gpu_plugin_,
      .wall_clock_offset = wall_clock_offset_,
      .finishers = &finishers_,
      .data_address = [this] { return DataAddress(); },
  };
}

void Daemon::Run() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&shutdown_), absl::Milliseconds(250))) break;
    }
    CheckCoordinatorGrace();
  }
  if (std::shared_ptr<JobRunner> job = Current()) {
    StopJob(job->job_id(), absl::UnavailableError("the worker is shutting down"));
  }
  // Wait (bounded by the stop grace) for the job's rank to be cleaned up.
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return job_ == nullptr; };
  mu_.AwaitWithTimeout(absl::Condition(&idle), options_.stop_grace + absl::Seconds(2));
}

void Daemon::CheckCoordinatorGrace() {
  if (session_->connected()) {
    unreachable_since_ = absl::InfiniteFuture();
    return;
  }
  const absl::Time now = absl::Now();
  if (unreachable_since_ == absl::InfiniteFuture()) unreachable_since_ = now;
  if (now - unreachable_since_ < options_.coordinator_grace) return;
  std::shared_ptr<JobRunner> job = Current();
  if (job == nullptr || job->stopped()) return;
  const std::string why = absl::StrCat("lost the coordinator at ", options_.coordinator, " for ",
                                       absl::FormatDuration(options_.coordinator_grace),
                                       " (--coordinator-grace): stopping rank ", job->rank(),
                                       " of job ", job->job_id());
  spdlog::error("{}", why);
  StopJob(job->job_id(), absl::UnavailableError(why));
}

void Daemon::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
}

std::shared_ptr<JobRunner> Daemon::Current() {
  absl::MutexLock lock(&mu_);
  return job_;
}

std::shared_ptr<JobRunner> Daemon::ServingJob() {
  absl::MutexLock lock(&mu_);
  return job_ != nullptr && job_->ready() ? job_ : nullptr;
}

std::shared_ptr<JobRunner> Daemon::ServingJob(const std::string& job_id, int64_t epoch) {
  std::shared_ptr<JobRunner> job = ServingJob();
  if (job == nullptr || job->job_id() != job_id || (epoch > 0 && job->epoch() != epoch)) {
    return nullptr;
  }
  return job;
}

void Daemon::OnMessage(const v1::CoordinatorMessage& m) {
  switch (m.kind_case()) {
    case v1::CoordinatorMessage::kAssignment:
      StartJob(m.assignment());
      break;
    case v1::CoordinatorMessage::kResponses:
      if (std::shared_ptr<JobRunner> job = ServingJob(m.responses().job_id())) {
        job->ApplyLists(m.responses());
      }
      break;
    case v1::CoordinatorMessage::kRelayed:
      // This daemon relays for its host: each peer's list goes to its link, its own is applied.
      if (std::shared_ptr<JobRunner> job = ServingJob(m.relayed().list().job_id())) {
        job->DeliverRelayed(m.relayed());
      }
      break;
    case v1::CoordinatorMessage::kResumed:
      if (std::shared_ptr<JobRunner> job = ServingJob(m.resumed().job_id(), m.resumed().epoch())) {
        job->Resumed(m.resumed());
      }
      break;
    case v1::CoordinatorMessage::kStopJob: {
      const v1::StopJob& stop = m.stop_job();
      StopJob(stop.job_id(),
              absl::AbortedError(absl::StrCat(
                  "job ", stop.job_id(),
                  stop.epoch() > 0 ? absl::StrCat(" epoch ", stop.epoch()) : std::string(),
                  " stopped: ", stop.reason())),
              stop.epoch());
      break;
    }
    case v1::CoordinatorMessage::kHostsUpdated: {
      const v1::HostsUpdated& h = m.hosts_updated();
      std::shared_ptr<JobRunner> job = Current();
      if (job != nullptr && job->job_id() == h.job_id() && job->epoch() == h.epoch()) {
        spdlog::info("job {} epoch {}: workers were added; rank {} resets at its next commit",
                     h.job_id(), h.epoch(), job->rank());
        job->MarkHostsUpdated();
      }
      break;
    }
    case v1::CoordinatorMessage::kClaimRefused:
      local_api_->ClaimRefused(m.claim_refused());
      break;
    case v1::CoordinatorMessage::kShutdown:
      spdlog::warn("coordinator asked the worker to shut down: {}", m.shutdown().reason());
      Shutdown();
      break;
    default:
      break;
  }
}

void Daemon::OnSessionOpen(v1::SessionOpen* open) {
  std::shared_ptr<JobRunner> job = ServingJob();
  if (job != nullptr && !job->stopped()) job->FillResume(open);
}

void Daemon::OnSessionLost(const absl::Status& status, bool reregistered) {
  // What the engine sends from now on waits for the next session's resume.
  if (std::shared_ptr<JobRunner> job = ServingJob()) job->SessionLost(status);
  if (status.code() == absl::StatusCode::kInvalidArgument && reregistered) {
    // Registration itself was refused (a bad --host-name or --device): retrying cannot help.
    spdlog::error("the coordinator refused this worker: {}", status.ToString());
    Shutdown();
    return;
  }
  // A new worker id means the coordinator has given up on the old one and failed its job.
  if (reregistered) {
    if (std::shared_ptr<JobRunner> job = Current()) {
      StopJob(job->job_id(),
              absl::UnavailableError(absl::StrCat("lost the coordinator: ", status.message())));
    }
  }
}

void Daemon::StartJob(const v1::JobAssignment& assignment) {
  local_api_->ClaimsDone();  // a claim is done with once a job comes
  const std::string& id = assignment.job().id();
  std::shared_ptr<JobRunner> job;
  std::shared_ptr<JobRunner> previous;  // an elastic job's epoch that this one follows
  std::shared_ptr<JobRunner> stale;     // an elastic job's epoch stopped for the queued next one
  {
    absl::MutexLock lock(&mu_);
    if (finished_ == absl::StrCat(id, "@", assignment.epoch())) {
      spdlog::info("assignment of {} ignored: its rank ran to its end here already", id);
      return;
    }
    const bool next_epoch = job_ != nullptr && job_->elastic() && job_->job_id() == id &&
                            assignment.epoch() > job_->epoch();
    if (next_epoch && job_->CanHandOverProcess()) {
      previous = job_;  // its process goes on in the new epoch
    } else if (next_epoch) {
      // The epoch this one follows has no process to hand over (still starting, or exited): it
      // stops, and the new epoch starts a process of its own once it is cleaned up.
      spdlog::info("job {} epoch {}: starts once epoch {} here is cleaned up", id,
                   assignment.epoch(), job_->epoch());
      queued_ = assignment;
      if (!job_->DeferStop()) stale = job_;  // else Start() stops it as soon as it is built
    } else if (job_ != nullptr) {
      if (job_->job_id() != id || job_->epoch() != assignment.epoch()) {
        // The coordinator freed this worker when the last job ended; its cleanup here (the
        // process's grace period) may not be over yet. The new rank starts right after it.
        spdlog::info("assignment of {} queued until {} is cleaned up", id, job_->job_id());
        queued_ = assignment;
      }
      return;  // else a re-sent assignment after a reconnect
    }
    if (stale == nullptr && queued_.has_value() && queued_->epoch() == assignment.epoch() &&
        queued_->job().id() == id) {
      return;  // queued behind an epoch still being built, which stops itself
    }
    if (stale == nullptr) {
      job = std::make_shared<JobRunner>(assignment, Context(), *this,
                                        previous != nullptr ? previous->process() : nullptr);
      job_ = job;
    }
  }
  if (stale != nullptr) {
    stale->Stop(absl::AbortedError(absl::StrCat("job ", id, " epoch ", stale->epoch(),
                                                " ended: its ranks changed (epoch ",
                                                assignment.epoch(), ")")));
    return;
  }
  job->Start(previous);
}

void Daemon::StopJob(const std::string& job_id, const absl::Status& reason, int64_t epoch) {
  std::shared_ptr<JobRunner> job;
  {
    absl::MutexLock lock(&mu_);
    if (queued_.has_value() && queued_->job().id() == job_id &&
        (epoch == 0 || queued_->epoch() <= epoch)) {
      queued_.reset();  // never started
    }
    job = job_;
    if (job == nullptr || job->job_id() != job_id) return;
  }
  job->StopFor(reason, epoch);
}

void Daemon::Finished(const std::shared_ptr<JobRunner>& runner) {
  std::optional<v1::JobAssignment> next;
  {
    absl::MutexLock lock(&mu_);
    if (job_ == runner) job_ = nullptr;
    finished_ = absl::StrCat(runner->job_id(), "@", runner->epoch());
    next.swap(queued_);
  }
  spdlog::info("job {}: rank cleaned up; {}", runner->job_id(),
               next ? "starting the queued one" : "idle");
  if (next) StartJob(*next);
}

void Daemon::DisconnectLocal() { local_->DisconnectAll(); }

absl::StatusOr<LocalAddress> Daemon::DataAddress() {
  {
    absl::MutexLock lock(&mu_);
    if (data_address_.has_value()) return *data_address_;
  }
  // Resolved without the lock (a DNS lookup may take seconds).
  // Towards the first of the coordinator's replicas: they share the hosts' network.
  absl::StatusOr<LocalAddress> a =
      options_.iface.empty()
          ? AddressTowards(options_.coordinator.substr(0, options_.coordinator.find(',')))
          : AddressOfInterface(options_.iface);
  if (a.ok()) {
    absl::MutexLock lock(&mu_);
    data_address_ = *a;
  }
  return a;
}

}  // namespace ringmaster
