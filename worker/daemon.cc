#include "worker/daemon.h"

#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/negotiation_wire.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "spdlog/spdlog.h"
#include "worker/cpu/cpu_executor.h"
#include "worker/cpu/gloo_backend.h"
#include "worker/gpu/gpu_executor.h"
#include "worker/negotiation/engine_wire.h"
#include "worker/rank_process.h"
#include "worker/rendezvous/rendezvous_client.h"
#ifdef RINGMASTER_HAVE_NCCL
#include "worker/gpu/plugin.h"
#endif

extern char** environ;

namespace ringmaster {
namespace {

namespace fs = std::filesystem;

constexpr size_t kMaxOutputChunk = 1 << 20;

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
  DaemonOptions& o = const_cast<DaemonOptions&>(options_);
  if (o.host_name.empty()) o.host_name = DefaultHostName();
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
  if (options_.device != "cpu") {
    int ordinal = -1;
    if (!absl::StartsWith(options_.device, "cuda:") ||
        !absl::SimpleAtoi(options_.device.substr(5), &ordinal) || ordinal < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--device '", options_.device, "' is not cpu or cuda:N"));
    }
#ifdef RINGMASTER_HAVE_NCCL
    // An absent or busy GPU (or a machine without CUDA's libraries) is refused here, at start,
    // with the reason.
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
#else
    return absl::FailedPreconditionError(absl::StrCat(
        "--device ", options_.device,
        ": this build has no CUDA/NCCL (configure with the CUDA toolkit and NCCL installed)"));
#endif
  }
  if (o.socket_path.empty())
    o.socket_path = absl::StrCat("/tmp/ringmaster-worker-", getpid(), ".sock");
  if (o.work_dir.empty()) {
    const char* tmp = getenv("TMPDIR");
    o.work_dir =
        absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/ringmaster-ranks-", getuid());
  }
  if (!options_.metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<MetricsServer>> metrics = MetricsServer::Start(
        options_.metrics_listen, &metrics_,
        HealthChecks{
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
  }
  absl::StatusOr<std::unique_ptr<LocalServer>> local =
      LocalServer::Start(o.socket_path, this, SocketAccess{.mode = 0660, .group = o.socket_group});
  if (!local.ok()) return local.status();
  local_ = *std::move(local);
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
  if (address.ok()) registration.set_address(address->address);
  registration.set_slot(options_.socket_path);  // kept across restarts: a restart replaces it
  session_ = std::make_unique<CoordinatorSession>(channel_, registration, this);
  session_->Start();
  session_started_.store(true);
  spdlog::info("worker on {} ({}) serving {}", options_.host_name, options_.device,
               options_.socket_path);
  return absl::OkStatus();
}

void Daemon::Run() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&shutdown_), absl::Milliseconds(250))) break;
    }
    CheckCoordinatorGrace();
  }
  if (std::shared_ptr<Job> job = CurrentJob()) {
    StopJob(job->assignment.job().id(), absl::UnavailableError("the worker is shutting down"));
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
  std::shared_ptr<Job> job = CurrentJob();
  if (job == nullptr || job->stopped) return;
  const std::string why = absl::StrCat(
      "lost the coordinator at ", options_.coordinator, " for ",
      absl::FormatDuration(options_.coordinator_grace), " (--coordinator-grace): stopping rank ",
      job->assignment.rank(), " of job ", job->assignment.job().id());
  spdlog::error("{}", why);
  StopJob(job->assignment.job().id(), absl::UnavailableError(why));
}

void Daemon::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
}

std::shared_ptr<Daemon::Job> Daemon::CurrentJob() {
  absl::MutexLock lock(&mu_);
  return job_;
}

void Daemon::OnMessage(const v1::CoordinatorMessage& m) {
  switch (m.kind_case()) {
    case v1::CoordinatorMessage::kAssignment:
      StartJob(m.assignment());
      break;
    case v1::CoordinatorMessage::kResponses: {
      std::shared_ptr<Job> job = ServingJob();
      if (job != nullptr && job->assignment.job().id() == m.responses().job_id()) {
        ApplyLists(*job, m.responses());
      }
      break;
    }
    case v1::CoordinatorMessage::kRelayed: {
      // This daemon relays for its host: each peer's list goes to its link, its own is applied.
      std::shared_ptr<Job> job = ServingJob();
      if (job != nullptr && job->relay_hub != nullptr &&
          job->assignment.job().id() == m.relayed().list().job_id()) {
        if (std::optional<v1::ResponseList> own = job->relay_hub->Deliver(m.relayed())) {
          ApplyLists(*job, *std::move(own));
        }
      }
      break;
    }
    case v1::CoordinatorMessage::kResumed: {
      std::shared_ptr<Job> job = ServingJob();
      const v1::SessionResumed& r = m.resumed();
      if (job == nullptr || job->assignment.job().id() != r.job_id() ||
          job->assignment.epoch() != r.epoch()) {
        break;
      }
      absl::MutexLock send_lock(&job->send_mu);
      // Resumed on its own session: the rank negotiates on it for the rest of the epoch (its
      // batches must not take two paths, which could reorder them).
      if (job->relay_link != nullptr) job->relay_link->EndRelaying();
      std::vector<v1::WorkerMessage> again = job->ledger->Resumed(r.last_request_seq());
      spdlog::info("job {} rank {}: session resumed; re-sending {} request batches", r.job_id(),
                   r.rank(), again.size());
      for (const v1::WorkerMessage& batch : again) {
        if (!session_->Send(batch).ok()) {
          job->ledger->Lost();  // the next session resumes again
          break;
        }
      }
      break;
    }
    case v1::CoordinatorMessage::kStopJob:
      StopJob(m.stop_job().job_id(),
              absl::AbortedError(absl::StrCat("job ", m.stop_job().job_id(),
                                              m.stop_job().epoch() > 0
                                                  ? absl::StrCat(" epoch ", m.stop_job().epoch())
                                                  : std::string(),
                                              " stopped: ", m.stop_job().reason())),
              m.stop_job().epoch());
      break;
    case v1::CoordinatorMessage::kHostsUpdated: {
      std::shared_ptr<Job> job = CurrentJob();
      if (job != nullptr && job->assignment.job().id() == m.hosts_updated().job_id() &&
          job->assignment.epoch() == m.hosts_updated().epoch()) {
        spdlog::info("job {} epoch {}: workers were added; rank {} resets at its next commit",
                     m.hosts_updated().job_id(), m.hosts_updated().epoch(), job->assignment.rank());
        job->hosts_updated->store(true);
      }
      break;
    }
    case v1::CoordinatorMessage::kClaimRefused: {
      const v1::ClaimRefused& r = m.claim_refused();
      absl::MutexLock lock(&claim_mu_);
      if (claim_.job_name == r.job_name() && claim_.rank == r.rank()) {
        claim_.refusal = absl::Status(static_cast<absl::StatusCode>(r.code()), r.message());
        if (claim_.refusal.ok()) claim_.refusal = absl::UnknownError(r.message());
        // NOT_FOUND (the job is not submitted yet) is expected while processes wait for it.
        spdlog::log(claim_.refusal.code() == absl::StatusCode::kNotFound ? spdlog::level::debug
                                                                         : spdlog::level::warn,
                    "claim of rank {} of attached job '{}' refused: {}", r.rank(), r.job_name(),
                    r.message());
      }
      break;
    }
    case v1::CoordinatorMessage::kShutdown:
      spdlog::warn("coordinator asked the worker to shut down: {}", m.shutdown().reason());
      Shutdown();
      break;
    default:
      break;
  }
}

void Daemon::OnSessionOpen(v1::SessionOpen* open) {
  std::shared_ptr<Job> job = ServingJob();
  if (job == nullptr || job->stopped) return;
  v1::RankResume* resume = open->add_resume();
  resume->set_job_id(job->assignment.job().id());
  resume->set_epoch(job->assignment.epoch());
  job->ledger->FillResume(resume);
  // A restarted coordinator lost the rendezvous keys set before: a rank still meeting its peers
  // would wait for them for ever. Set again (on a thread of its own: this one opens the session).
  if (!job->rendezvous->keys().empty()) {
    finishers_.Start([channel = channel_, job] {
      // With the journal: a stop of the job cancels this too (recording its keys again is a no-op).
      RendezvousClient client(channel, job->assignment.job().id(), job->assignment.epoch(),
                              job->rendezvous, job->assignment.rendezvous_token());
      if (absl::Status s = client.Republish(*job->rendezvous); !s.ok()) {
        spdlog::warn("job {} rank {}: rendezvous keys not published again: {}",
                     job->assignment.job().id(), job->assignment.rank(), s.ToString());
      }
    });
  }
}

void Daemon::OnSessionLost(const absl::Status& status, bool reregistered) {
  // What the engine sends from now on waits for the next session's resume. A relay's host peers
  // may have lost what it carried for them: they resume on their own sessions.
  if (std::shared_ptr<Job> job = ServingJob()) {
    job->ledger->Lost();
    if (job->relay_hub != nullptr) {
      job->relay_hub->Fail(absl::StrCat("its session ended: ", status.message()));
    }
  }
  if (status.code() == absl::StatusCode::kInvalidArgument && reregistered) {
    // Registration itself was refused (a bad --host-name or --device): retrying cannot help.
    spdlog::error("the coordinator refused this worker: {}", status.ToString());
    Shutdown();
    return;
  }
  // A new worker id means the coordinator has given up on the old one and failed its job.
  if (reregistered) {
    if (std::shared_ptr<Job> job = CurrentJob()) {
      StopJob(job->assignment.job().id(),
              absl::UnavailableError(absl::StrCat("lost the coordinator: ", status.message())));
    }
  }
}

void Daemon::StartJob(const v1::JobAssignment& assignment) {
  {
    absl::MutexLock lock(&claim_mu_);
    claim_ = Claim{};  // a claim is done with once a job comes
  }
  std::shared_ptr<Job> job;
  std::shared_ptr<Job> previous;  // an elastic job's epoch that this one follows
  std::shared_ptr<Job> stale;     // an elastic job's epoch stopped for the queued next one
  {
    absl::MutexLock lock(&mu_);
    if (finished_ == absl::StrCat(assignment.job().id(), "@", assignment.epoch())) {
      spdlog::info("assignment of {} ignored: its rank ran to its end here already",
                   assignment.job().id());
      return;
    }
    const bool next_epoch = job_ != nullptr && job_->elastic() &&
                            job_->assignment.job().id() == assignment.job().id() &&
                            assignment.epoch() > job_->assignment.epoch();
    if (next_epoch && job_->ready && !job_->stopped && job_->proc->child_pid.load() != 0 &&
        !job_->proc->exited) {
      previous = job_;  // its process goes on in the new epoch
    } else if (next_epoch) {
      // The epoch this one follows has no process to hand over (still starting, or exited): it
      // stops, and the new epoch starts a process of its own once it is cleaned up.
      spdlog::info("job {} epoch {}: starts once epoch {} here is cleaned up",
                   assignment.job().id(), assignment.epoch(), job_->assignment.epoch());
      queued_ = assignment;
      if (job_->ready) {
        stale = job_;
      } else {
        job_->stop_requested = true;  // StartJob stops it as soon as it is built
      }
    } else if (job_ != nullptr) {
      if (job_->assignment.job().id() != assignment.job().id() ||
          job_->assignment.epoch() != assignment.epoch()) {
        // The coordinator freed this worker when the last job ended; its cleanup here (the
        // process's grace period) may not be over yet. The new rank starts right after it.
        spdlog::info("assignment of {} queued until {} is cleaned up", assignment.job().id(),
                     job_->assignment.job().id());
        queued_ = assignment;
      }
      return;  // else a re-sent assignment after a reconnect
    }
    if (stale == nullptr && queued_.has_value() && queued_->epoch() == assignment.epoch() &&
        queued_->job().id() == assignment.job().id()) {
      return;  // queued behind an epoch still being built, which stops itself
    }
    if (stale == nullptr) {
      job = std::make_shared<Job>();
      job->assignment = assignment;
      if (previous != nullptr) {
        job->proc = previous->proc;
        job->started = previous->started.load();
      }
      job_ = job;
    }
  }
  if (stale != nullptr) {
    StopRank(stale, absl::AbortedError(absl::StrCat(
                        "job ", assignment.job().id(), " epoch ", stale->assignment.epoch(),
                        " ended: its ranks changed (epoch ", assignment.epoch(), ")")));
    return;
  }
  const v1::Job& spec = assignment.job();
  const int rank = assignment.rank();
  if (previous != nullptr) {
    spdlog::info("job {} epoch {}: rank {} of {} (rank {} in epoch {})", spec.id(),
                 assignment.epoch(), rank, spec.spec().np(), previous->assignment.rank(),
                 previous->assignment.epoch());
    EndEpoch(previous, absl::AbortedError(absl::StrCat(
                           "job ", spec.id(), " epoch ", previous->assignment.epoch(),
                           " ended: its ranks changed (epoch ", assignment.epoch(), " has ",
                           spec.spec().np(), "); reset into the new epoch (hvd.elastic)")));
    absl::MutexLock lock(&job->proc->output_mu);
    job->proc->output_epoch = assignment.epoch();
    job->proc->output_rank = rank;
    job->proc->output_seq = 0;
  } else {
    spdlog::info("job {} rank {} of {}: starting", spec.id(), rank, spec.spec().np());
  }
  const std::string arena_name =
      absl::StrCat("ringmaster-", spec.id(), "-", assignment.epoch(), "-rank-", rank);
  absl::StatusOr<std::unique_ptr<SharedMemory>> arena =
      SharedMemory::Create(arena_name, options_.arena_bytes);
  if (!arena.ok()) {
    FailStart(job, absl::StrCat("worker could not create its arena: ", arena.status().message()));
    return;
  }
  job->arena = *std::move(arena);
  absl::StatusOr<LocalAddress> address = DataAddress();
  if (!address.ok()) {
    FailStart(job, absl::StrCat("worker has no address for the data plane: ",
                                address.status().message()));
    return;
  }
  const size_t client_bytes = options_.arena_bytes / 4 * 3;
  job->outputs = std::make_unique<ArenaAllocator>(client_bytes, options_.arena_bytes);

  EngineOptions e;
  e.job_id = spec.id();
  e.epoch = assignment.epoch();
  e.rank = rank;
  e.size = spec.spec().np();
  e.host = options_.host_name;
  e.arena_bytes = job->arena->size();
  e.cycle_time =
      absl::Microseconds(static_cast<int64_t>(spec.spec().knobs().cycle_time_ms() * 1000));
  // Horovod records the timeline's execution rows on rank 0.
  e.timeline = rank == 0 && !spec.spec().knobs().timeline().empty();
  e.wall_clock_offset = wall_clock_offset_;
  auto channel = channel_;
  const std::string iface = options_.iface;
  const std::string hostname = address->address;
  const absl::Duration timeout = options_.collective_timeout;
  CpuExecutorOptions cpu;
  cpu.rank = rank;
  cpu.size = spec.spec().np();
  cpu.arena = job->arena->data();
  cpu.outputs = job->outputs.get();
  std::shared_ptr<RendezvousJournal> journal = job->rendezvous;
  // A Gloo communicator among `size` ranks meeting under `prefix`: the job's (one per index), or a
  // process set's (its members, under the set's key).
  auto gloo = [channel, spec, assignment, iface, hostname, timeout, journal](
                  int gloo_rank, int size, std::string prefix) {
    GlooBackendOptions g;
    g.rank = gloo_rank;
    g.size = size;
    g.store = std::make_shared<RendezvousClient>(channel, spec.id(), assignment.epoch(), journal,
                                                 assignment.rendezvous_token());
    g.prefix = std::move(prefix);
    g.iface = iface;
    g.hostname = hostname;
    g.timeout = timeout;
    return CreateGlooBackend(std::move(g));
  };
  cpu.make_backend = [gloo, rank, np = spec.spec().np()](int index) {
    return gloo(rank, np, absl::StrCat("gloo/", index, "/"));
  };
  cpu.make_set_backend = [gloo](const std::string& key, int set_rank, int set_size) {
    return gloo(set_rank, set_size, absl::StrCat("gloo/", key, "/"));
  };
  cpu.hierarchical_allreduce = spec.spec().knobs().hierarchical_allreduce();
  cpu.hierarchical_allgather = spec.spec().knobs().hierarchical_allgather();
  // Off under autotune, which scores what the coordinator negotiates.
  cpu.local_negotiation =
      (!spec.spec().knobs().has_local_negotiation() || spec.spec().knobs().local_negotiation()) &&
      !spec.spec().knobs().autotune();
  if (!spec.spec().knobs().has_shm_allreduce() || spec.spec().knobs().shm_allreduce()) {
    cpu.make_host_group = [channel, spec, assignment, journal, rank, host = options_.host_name,
                           timeout]() {
      ShmGroupOptions o;
      o.rank = rank;
      o.size = spec.spec().np();
      o.store = std::make_shared<RendezvousClient>(channel, spec.id(), assignment.epoch(), journal,
                                                   assignment.rendezvous_token());
      o.host = host;
      o.across_hosts = spec.spec().knobs().hierarchical_allreduce() ||
                       spec.spec().knobs().hierarchical_allgather();
      o.timeout = timeout;
      return ConnectShmGroup(std::move(o));
    };
  }
  CoordinatorSession* session = session_.get();
  job->ledger = std::make_unique<SessionLedger>(rank);
  SessionLedger* ledger = job->ledger.get();
  absl::Mutex* send_mu = &job->send_mu;
  e.send_span = [session, job_id = spec.id(), epoch = assignment.epoch(), rank](
                    const ExecutionSpan& span, int64_t sent_unix_us) {
    v1::WorkerMessage m;
    v1::TimelineSpans* spans = m.mutable_timeline();
    spans->set_job_id(job_id);
    spans->set_epoch(epoch);
    spans->set_rank(rank);
    ToProto(span, spans->add_spans());
    spans->set_sent_unix_us(sent_unix_us);
    session->Send(m).IgnoreError();  // best effort
  };
  Job* raw = job.get();
  e.send_requests = [session, ledger, send_mu, raw](const RequestBatch& batch) {
    // Request batches are numbered and kept until acknowledged: one that cannot go now goes when
    // the next session resumes.
    v1::WorkerMessage numbered;
    ToProto(batch, numbered.mutable_requests());
    absl::MutexLock send_lock(send_mu);
    if (!ledger->Prepare(numbered)) return;
    // Through the host's relay while it relays (the relay itself sends its own with its peers').
    if (raw->relay_hub != nullptr && raw->relay_hub->Submit(numbered.requests())) return;
    if (raw->relay_link != nullptr) {
      const RelayLink::Sent sent = raw->relay_link->Send(numbered.requests());
      if (sent != RelayLink::Sent::kDirect) return;  // taken, or held for the resume
    }
    if (absl::Status s = session->Send(numbered); !s.ok()) {
      spdlog::info("request batch {} kept for the next session: {}", numbered.requests().seq(),
                   s.ToString());
      ledger->Lost();
    }
  };
  e.metrics = options_.record_metrics ? &metrics_ : nullptr;
  if (cuda_device_ < 0) {
    e.executor = std::make_unique<CpuExecutor>(std::move(cpu));
  } else {
    if (absl::Status s = StartDevice(*job, e); !s.ok()) {
      FailStart(job,
                absl::StrCat("worker could not set up cuda:", cuda_device_, ": ", s.message()));
      return;
    }
  }
  job->engine = std::make_unique<Engine>(std::move(e));
  StartRelay(job);
  // Ready before the engine starts: responses can only follow the requests it will send, and must
  // find it (StartJob may run on a cleanup thread, not the session thread).
  bool stop_requested;
  {
    absl::MutexLock lock(&mu_);
    job->ready = true;
    stop_requested = job->stop_requested;
  }
  job->engine->Start();
  if (stop_requested) {
    StopJob(spec.id(),
            absl::AbortedError(absl::StrCat("job ", spec.id(), " stopped while starting")));
    return;
  }
  if (previous != nullptr) return;  // the rank's process runs on: it resets into this epoch

  if (spec.spec().command().empty()) {
    spdlog::info("job {} rank {}: waiting for a training process on {}", spec.id(), rank,
                 options_.socket_path);
    return;  // STARTED when the process attaches
  }
  job->proc->waiter = std::thread([this, job]() mutable { RunRank(std::move(job)); });
}

void Daemon::ApplyLists(Job& job, v1::ResponseList list) {
  absl::MutexLock apply_lock(&job.apply_mu);
  // In cycle order, once each (the reliable session).
  for (const v1::ResponseList& in_order : job.ledger->Accept(std::move(list))) {
    RankCycle cycle;
    FromProto(in_order, &cycle);
    job.engine->OnResponses(std::move(cycle));
  }
}

void Daemon::StartRelay(const std::shared_ptr<Job>& job) {
  const v1::JobAssignment& assignment = job->assignment;
  const RelayPlan plan = PlanRelay(assignment);
  if (plan.relay_rank < 0) return;
  const v1::Job& spec = assignment.job();
  const int32_t rank = assignment.rank();
  auto store = std::make_shared<RendezvousClient>(channel_, spec.id(), assignment.epoch(),
                                                  job->rendezvous, assignment.rendezvous_token());
  if (plan.relays(rank)) {
    RelayHub::Options o;
    o.job_id = spec.id();
    o.epoch = assignment.epoch();
    o.rank = rank;
    o.peers.assign(plan.ranks.begin() + 1, plan.ranks.end());
    o.token = assignment.rendezvous_token();
    o.store = store;
    if (plan.spans_hosts) {
      // Its group's other hosts reach it where they reach its data plane.
      absl::StatusOr<LocalAddress> address = DataAddress();
      if (!address.ok()) {
        spdlog::warn("job {} rank {}: cannot relay for its group's ranks: {}", spec.id(), rank,
                     address.status().ToString());
        finishers_.Start([store, rank] { store->Set(RelayKey(rank), "").IgnoreError(); });
        return;
      }
      o.tcp_address = address->address;
    }
    CoordinatorSession* session = session_.get();
    o.send = [session](const v1::WorkerMessage& m) { return session->Send(m); };
    o.linger = absl::Microseconds(static_cast<int64_t>(spec.spec().knobs().cycle_time_ms() * 1000));
    if (options_.record_metrics) {
      o.metrics = &metrics_;
      o.host = options_.host_name;
    }
    // What the hub held is lost: the rank's own batches wait for a resume, which re-sends them.
    Job* raw = job.get();
    o.on_failed = [raw, session](const std::string&) {
      raw->ledger->Lost();
      if (!raw->proc->exited && !raw->stopped && !raw->epoch_ended) session->Interrupt();
    };
    absl::StatusOr<std::unique_ptr<RelayHub>> hub = RelayHub::Start(std::move(o));
    if (!hub.ok()) {
      // Its peers find no relay at once and negotiate on their own sessions.
      spdlog::warn("job {} rank {}: cannot relay for its group's ranks: {}", spec.id(), rank,
                   hub.status().ToString());
      // Said off this thread (a session's): the rendezvous may take a while.
      finishers_.Start([store, rank] { store->Set(RelayKey(rank), "").IgnoreError(); });
      return;
    }
    job->relay_hub = *std::move(hub);
    spdlog::info("job {} rank {}: relays the negotiation of {} ranks{}", spec.id(), rank,
                 plan.ranks.size(),
                 plan.spans_hosts ? absl::StrCat(" of its hosts, at ", job->relay_hub->name())
                                  : " of its host");
    return;
  }
  RelayLink::Options o;
  o.job_id = spec.id();
  o.epoch = assignment.epoch();
  o.rank = rank;
  o.relay_rank = plan.relay_rank;
  o.token = assignment.rendezvous_token();
  o.store = store;
  Job* raw = job.get();
  o.on_list = [raw](v1::ResponseList list) { ApplyLists(*raw, std::move(list)); };
  // The batches the link may have lost are in the ledger: held from now on, and re-sent by the
  // resume that interrupting the session brings.
  CoordinatorSession* session = session_.get();
  o.on_lost = [raw, session](const absl::Status& why) {
    raw->ledger->Lost();
    // A rank whose process has exited negotiates nothing more (the relay's rank may end first).
    if (raw->proc->exited || raw->stopped || raw->epoch_ended) return;
    spdlog::warn(
        "job {} rank {}: negotiating on its own session from now on: the link to relay "
        "rank {} {}",
        raw->assignment.job().id(), raw->assignment.rank(), PlanRelay(raw->assignment).relay_rank,
        std::string(why.message()));
    session->Interrupt();
  };
  job->relay_link = RelayLink::Start(std::move(o));
}

void Daemon::FailStart(const std::shared_ptr<Job>& job, const std::string& why) {
  SendRankUpdate(*job, v1::RANK_STATE_EXITED, 1, why);
  if (job->proc->child_pid.load() == 0) {
    FinishJob(job);
    return;
  }
  // An elastic job's process from an earlier epoch: it stops, and its waiter finishes the rank.
  job->stopped = true;
  finishers_.Start(
      [proc = job->proc, grace = options_.stop_grace] { proc->child->Terminate(grace); });
}

absl::Status Daemon::PrepareRankDir(Job& job) {
  const v1::Job& spec = job.assignment.job();
  absl::StatusOr<std::string> dir =
      MakeRankDir(options_.work_dir, job.assignment, [&](const std::string& archive) {
        RendezvousClient client(channel_, spec.id(), job.assignment.epoch(), job.rendezvous,
                                job.assignment.rendezvous_token());
        return client.FetchSource(archive);
      });
  if (!dir.ok()) return dir.status();
  job.proc->dir = *std::move(dir);
  return absl::OkStatus();
}

void Daemon::RunRank(std::shared_ptr<Job> job) {
  absl::Status s = PrepareRankDir(*job);
  if (s.ok()) s = LaunchChild(job);
  if (!s.ok()) {
    if (job->stopped) return;  // StopJob found no process: it finishes the job
    SendRankUpdate(*job, v1::RANK_STATE_EXITED, 127, std::string(s.message()));
    FinishJob(job);
    return;
  }
  // An elastic job's process outlives its first epoch: the first epoch's Job (its arena, its GPU
  // side) is not held while the process runs.
  std::shared_ptr<Process> proc = job->proc;
  std::weak_ptr<Job> first = job;
  job.reset();
  ChildExit exit = proc->child->Wait();
  proc->exited = true;
  // Its exit is the current epoch's, once that is built (StartJob is quick; bounded here).
  std::shared_ptr<Job> current;
  for (int i = 0; i < 500; ++i) {
    {
      absl::MutexLock lock(&mu_);
      current = job_ != nullptr && job_->proc == proc ? job_ : nullptr;
      if (current == nullptr || current->ready || current->stopped) break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  if (current == nullptr || (!current->ready && !current->stopped)) current = first.lock();
  if (current == nullptr) return;  // every epoch of it was cleaned up already
  RunRankExited(current, exit);
}

void Daemon::RunRankExited(const std::shared_ptr<Job>& job, const ChildExit& exit) {
  spdlog::info("job {} rank {}: process exited with {} {}", job->assignment.job().id(),
               job->assignment.rank(), exit.exit_code, exit.message);
  // Before the exit is reported: the job's end must find the rank's files among its artifacts.
  // A failed send costs the files, not the job.
  RendezvousClient files(channel_, job->assignment.job().id(), job->assignment.epoch(), nullptr,
                         job->assignment.rendezvous_token());
  int32_t sent_files = 0;
  int64_t sent_bytes = 0;
  if (absl::Status put = files.PutOutput(job->assignment.rank(), job->proc->dir + "/output",
                                         &sent_files, &sent_bytes);
      !put.ok()) {
    spdlog::warn("job {} rank {}: its output files were not all kept: {}",
                 job->assignment.job().id(), job->assignment.rank(), put.ToString());
  } else if (sent_files > 0) {
    spdlog::info("job {} rank {}: sent {} output files ({} bytes)", job->assignment.job().id(),
                 job->assignment.rank(), sent_files, sent_bytes);
  }
  // Peers in a collective with this rank learn why it ended (their error names it), not that a
  // job was "stopped".
  bool ready;
  {
    absl::MutexLock lock(&mu_);
    ready = job->ready;  // its engine is built
  }
  if (ready && job->engine != nullptr && !job->stopped) {
    const v1::RankInfo& me = job->assignment.job().ranks(job->assignment.rank());
    job->engine->Abort(absl::CancelledError(absl::StrCat(
        "rank ", job->assignment.rank(), " on host ", me.host(), " exited with status ",
        exit.exit_code, exit.message.empty() ? "" : absl::StrCat(" (", exit.message, ")"))));
  }
  // Also when the job stopped it: the coordinator then knows the rank's output is all there (it
  // came first) and ends the job's log without waiting out its linger.
  SendRankUpdate(*job, v1::RANK_STATE_EXITED, exit.exit_code, exit.message);
  FinishJob(job);
}

absl::Status Daemon::LaunchChild(const std::shared_ptr<Job>& job) {
  const v1::Job& spec = job->assignment.job();
  const int rank = job->assignment.rank();
  const RankPlace place{options_.socket_path, options_.coordinator, job->proc->dir};
  const std::map<std::string, std::string> env =
      RankEnvironment(job->assignment, place, ProcessEnvironment());
  const std::string cwd = RankWorkingDir(job->assignment, place);
  std::vector<std::string> argv(spec.spec().command().begin(), spec.spec().command().end());
  CoordinatorSession* session = session_.get();
  // Numbered (the reliable session: re-sent after a reconnect, deduplicated by the coordinator);
  // stdout's and stderr's readers number and send under one lock, so the numbers go out in order.
  // The output is the current epoch's (an elastic job's process outlives its first).
  std::shared_ptr<Process> proc = job->proc;
  {
    absl::MutexLock lock(&proc->output_mu);
    proc->output_job = spec.id();
    proc->output_epoch = job->assignment.epoch();
    proc->output_rank = rank;
    proc->output_seq = 0;
  }
  auto print = [session, weak = std::weak_ptr<Process>(proc)](int stream, std::string data) {
    std::shared_ptr<Process> proc = weak.lock();
    if (proc == nullptr) return;
    absl::MutexLock lock(&proc->output_mu);
    for (size_t at = 0; at < data.size(); at += kMaxOutputChunk) {
      v1::WorkerMessage m;
      v1::RankOutput* o = m.mutable_output();
      o->set_job_id(proc->output_job);
      o->set_epoch(proc->output_epoch);
      o->set_rank(proc->output_rank);
      o->set_stream(stream == 1 ? v1::RankOutput::STREAM_STDOUT : v1::RankOutput::STREAM_STDERR);
      o->set_data(data.substr(at, kMaxOutputChunk));
      // Numbers grow across an elastic job's epochs too (the coordinator drops a rank's chunk
      // numbered at or below the last it stored): the epoch in the high bits.
      o->set_seq((static_cast<uint64_t>(proc->output_epoch) << 40) | ++proc->output_seq);
      session->Send(m).IgnoreError();
    }
  };
  {
    absl::MutexLock lock(&job->proc->launch_mu);
    if (job->stopped) {
      return absl::AbortedError(
          absl::StrCat("job ", spec.id(), " stopped before rank ", rank, " started"));
    }
    absl::StatusOr<std::unique_ptr<ChildProcess>> child =
        ChildProcess::Start(argv, env, cwd, print);
    if (!child.ok()) return child.status();
    job->proc->child = *std::move(child);
  }
  job->proc->child_pid.store(job->proc->child->pid());
  job->started = true;
  SendRankUpdate(*job, v1::RANK_STATE_STARTED, 0, "");
  return absl::OkStatus();
}

void Daemon::SendRankUpdate(const Job& job, v1::RankState state, int exit_code,
                            const std::string& text, bool failed) {
  v1::WorkerMessage m;
  v1::RankUpdate* u = m.mutable_rank_update();
  u->set_job_id(job.assignment.job().id());
  u->set_epoch(job.assignment.epoch());
  u->set_rank(job.assignment.rank());
  u->set_state(state);
  u->set_exit_code(exit_code);
  u->set_message(text.substr(0, 4096));
  u->set_failed(failed);
  if (absl::Status s = session_->Send(m); !s.ok()) {
    spdlog::warn("rank update not delivered: {}", s.ToString());
  }
}

void Daemon::StopJob(const std::string& job_id, const absl::Status& reason, int64_t epoch) {
  std::shared_ptr<Job> job;
  {
    absl::MutexLock lock(&mu_);
    if (queued_.has_value() && queued_->job().id() == job_id &&
        (epoch == 0 || queued_->epoch() <= epoch)) {
      queued_.reset();  // never started
    }
    job = job_;
    if (job == nullptr || job->assignment.job().id() != job_id) return;
    if (epoch > 0 && epoch < job->assignment.epoch()) return;  // an epoch this rank has left
    if (epoch > 0 && job->ready && job->elastic() && !job->stopped) {
      // Too few ranks are left for a new epoch: the process waits (in its reset) for the next.
      if (!job->epoch_ended.exchange(true)) {
        spdlog::info("job {} epoch {} ended: {}", job_id, epoch, reason.ToString());
        job->rendezvous->Cancel();
        job->engine->Abort(reason);
      }
      return;
    }
    if (!job->ready) {  // StartJob stops it as soon as it is built
      job->stop_requested = true;
      return;
    }
  }
  StopRank(job, reason);
}

void Daemon::EndRelay(Job& job, const std::string& why) {
  if (job.relay_hub != nullptr) job.relay_hub->Fail(why);
  if (job.relay_link != nullptr) job.relay_link->Stop();
}

void Daemon::StopRank(const std::shared_ptr<Job>& job, const absl::Status& reason) {
  if (job->stopped.exchange(true)) return;
  EndRelay(*job, "its rank stops");
  spdlog::info("stopping job {} epoch {}: {}", job->assignment.job().id(), job->assignment.epoch(),
               reason.ToString());
  // A rank still meeting its peers stops waiting for the coordinator.
  job->rendezvous->Cancel();
  // Pending operations fail at once with the reason; the process gets SIGTERM, then SIGKILL.
  job->engine->Abort(reason);
  ChildProcess* child;
  {
    absl::MutexLock lock(&job->proc->launch_mu);
    child = job->proc->child.get();
  }
  if (child != nullptr) {
    // Not detached: the job must not outlive the daemon (its engine's gauges live in metrics_).
    finishers_.Start([job, grace = options_.stop_grace] { job->proc->child->Terminate(grace); });
  } else {
    FinishJob(job);
  }
}

void Daemon::EndEpoch(const std::shared_ptr<Job>& job, const absl::Status& reason) {
  job->epoch_ended = true;
  EndRelay(*job, "its epoch ended");
  {
    absl::MutexLock lock(&job->attach_mu);
    job->closing = true;  // no welcome into it any more: its arena goes
  }
  job->rendezvous->Cancel();  // a rank still meeting its old peers stops
  job->engine->Abort(reason);
  // The engine's threads (a Gloo pair still connecting to a peer that is gone ends within the
  // collective timeout) and the epoch's arena go on a thread of their own; the process does not.
  finishers_.Start([job] {
    job->engine->Stop();
    job->arena.reset();  // unmapped here; the process unmaps its view when it lets go of it
  });
}

void Daemon::RequestReset(Job& job, const std::string& why) {
  if (job.reset_sent.exchange(true)) return;
  spdlog::info("job {} epoch {}: rank {} asks for a new epoch: {}", job.assignment.job().id(),
               job.assignment.epoch(), job.assignment.rank(), why);
  v1::WorkerMessage m;
  v1::RankReset* r = m.mutable_reset();
  r->set_job_id(job.assignment.job().id());
  r->set_epoch(job.assignment.epoch());
  r->set_rank(job.assignment.rank());
  r->set_reason(why.substr(0, 4096));
  if (absl::Status s = session_->Send(m); !s.ok()) {
    job.reset_sent = false;  // asked again at the process's next try
    spdlog::warn("reset of job {} not delivered: {}", job.assignment.job().id(), s.ToString());
  }
}

void Daemon::FinishJob(std::shared_ptr<Job> job) {
  // Cleanup joins the engine and the waiter, so it runs on a thread of its own.
  finishers_.Start([this, job] {
    job->rendezvous->Cancel();  // its engine may still be meeting its peers
    EndRelay(*job, "its rank finished");
    // A Gloo pair connecting to a peer that is gone cannot be cancelled (it gives up after the
    // collective timeout): the slot does not wait for it. The job, its arena included, stays
    // until the engine has stopped, on a thread of its own.
    // A GPU slot waits: the old job's device arena and NCCL setup would leave the next one short
    // of GPU memory.
    bool stopped = true;
    const absl::Duration wait = job->gpu != nullptr ? absl::InfiniteDuration() : absl::Seconds(1);
    if (job->engine != nullptr && !job->engine->StopWithin(wait)) {
      stopped = false;
      spdlog::info(
          "job {} rank {}: its communicator setup ends within the collective timeout; "
          "the slot is free now",
          job->assignment.job().id(), job->assignment.rank());
      finishers_.Start([job] { job->engine->Stop(); });
    }
    if (job->proc->waiter.joinable() && job->proc->waiter.get_id() != std::this_thread::get_id()) {
      job->proc->waiter.join();
    }
    {
      absl::MutexLock lock(&job->attach_mu);
      job->closing = true;  // no welcome into this job any more
    }
    local_->DisconnectAll();
    if (!job->proc->dir.empty()) {
      std::error_code error;
      fs::remove_all(job->proc->dir, error);  // the rank's code and output (sent already)
    }
    const std::string id = job->assignment.job().id();
    // The memory goes once the training process has unmapped it too (and, when the engine is
    // still stopping, once that thread drops the job).
    if (stopped) job->arena.reset();
    std::optional<v1::JobAssignment> next;
    {
      absl::MutexLock lock(&mu_);
      if (job_ == job) job_ = nullptr;
      finished_ = absl::StrCat(id, "@", job->assignment.epoch());
      next.swap(queued_);
    }
    spdlog::info("job {}: rank cleaned up; {}", id, next ? "starting the queued one" : "idle");
    if (next) StartJob(*next);
  });
}

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

std::shared_ptr<Daemon::Job> Daemon::ServingJob() {
  absl::MutexLock lock(&mu_);
  return job_ != nullptr && job_->ready ? job_ : nullptr;
}

absl::Status Daemon::StartDevice(Job& job, EngineOptions& e) {
#ifdef RINGMASTER_HAVE_NCCL
  const v1::Job& spec = job.assignment.job();
  GpuJobOptions g;
  g.device = cuda_device_;
  g.rank = job.assignment.rank();
  g.size = spec.spec().np();
  g.arena_bytes = static_cast<int64_t>(options_.arena_bytes);
  auto channel = channel_;
  const v1::JobAssignment assignment = job.assignment;
  const std::string where =
      absl::StrCat("rank ", g.rank, " (", options_.host_name, ", cuda:", cuda_device_, ")");
  const absl::Duration timeout = options_.collective_timeout;
  const int device = cuda_device_;
  // The communicator failing by itself (an NCCL error, a collective past its deadline) fails the
  // rank at the coordinator, which fails the job (and stops the other ranks) with this message.
  // The backend lives inside `job`, so the callback never outlives it.
  Job* failed_job = &job;
  auto on_fail = [this, failed_job](const absl::Status& s) {
    SendRankUpdate(*failed_job, v1::RANK_STATE_EXITED, 1, std::string(s.message()),
                   /*failed=*/true);
  };
  std::shared_ptr<RendezvousJournal> journal = job.rendezvous;
  const GpuPlugin* plugin = gpu_plugin_;
  auto nccl = [plugin, channel, assignment, where, timeout, device, on_fail, journal](
                  std::shared_ptr<std::atomic<bool>> cancelled, const std::string& prefix, int rank,
                  int size, void* stream, const std::string& set) {
    NcclBackendOptions n;
    n.rank = rank;
    n.size = size;
    n.device = device;
    n.store = std::make_shared<RendezvousClient>(channel, assignment.job().id(), assignment.epoch(),
                                                 journal, assignment.rendezvous_token());
    n.prefix = prefix;
    n.where = set.empty() ? where : absl::StrCat(where, " in process set ", set);
    n.timeout = timeout;
    n.cancelled = std::move(cancelled);
    n.on_fail = on_fail;
    n.stream = stream;
    return plugin->create_backend(std::move(n));
  };
  g.make_backend = [nccl, rank = g.rank, size = g.size](std::shared_ptr<std::atomic<bool>> c) {
    return nccl(std::move(c), "nccl/0/", rank, size, nullptr, "");
  };
  g.make_set_backend = [nccl](std::shared_ptr<std::atomic<bool>> c, const std::string& key,
                              int set_rank, int set_size, void* stream) {
    return nccl(std::move(c), absl::StrCat("nccl/", key, "/"), set_rank, set_size, stream, key);
  };
  absl::StatusOr<GpuJobParts> gpu = plugin->create_job(std::move(g));
  if (!gpu.ok()) return gpu.status();
  job.device_pci_bus_id = std::move(gpu->pci_bus_id);
  job.device_arena_handle = std::move(gpu->arena_handle);
  job.done_event_handles = std::move(gpu->done_event_handles);
  e.executor = std::make_unique<GpuExecutor>(gpu->job.get(), job.outputs.get(), g.rank, g.size);
  job.gpu = std::move(gpu->job);
  return absl::OkStatus();
#else
  return absl::FailedPreconditionError("this build has no CUDA/NCCL");
#endif
}

absl::Status Daemon::OnReadyEvents(const v1::LocalReadyEvents& events) {
  std::shared_ptr<Job> job = ServingJob();
  if (job == nullptr || job->gpu == nullptr) {
    return absl::FailedPreconditionError("no GPU job is being served");
  }
  return job->gpu->OpenReadyEvents({events.handles().begin(), events.handles().end()});
}

namespace {

// Whether `pid` is `ancestor` or one of its descendants (by /proc's parent links, at most 64 up).
bool DescendsFrom(pid_t pid, pid_t ancestor) {
  for (int i = 0; i < 64 && pid > 1; ++i) {
    if (pid == ancestor) return true;
    FILE* f = std::fopen(absl::StrCat("/proc/", pid, "/stat").c_str(), "r");
    if (f == nullptr) return false;
    char line[512];
    const size_t n = std::fread(line, 1, sizeof(line) - 1, f);
    std::fclose(f);
    line[n] = '\0';
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses; the last ')' ends it.
    const char* close = std::strrchr(line, ')');
    int parent = 0;
    char state = 0;
    if (close == nullptr || std::sscanf(close + 1, " %c %d", &state, &parent) != 2) return false;
    pid = parent;
  }
  return pid == ancestor;
}

}  // namespace

absl::Status Daemon::ClaimRank(const std::string& job_name, int32_t rank) {
  // A claim is sent again now and then: a coordinator that restarted (or a job submitted after a
  // NOT_FOUND) hears of it without the process giving up.
  constexpr absl::Duration kResend = absl::Seconds(2);
  constexpr absl::Duration kResendNotFound = absl::Milliseconds(500);  // the job may come any time
  const absl::Time now = absl::Now();
  bool send = false;
  {
    absl::MutexLock lock(&claim_mu_);
    if (claim_.job_name != job_name || claim_.rank != rank) {
      claim_ = Claim{job_name, rank, now, absl::OkStatus()};
      send = true;
    } else if (!claim_.refusal.ok() && claim_.refusal.code() != absl::StatusCode::kNotFound) {
      // Refused for good (no such rank, held by another worker, ...): the process stops waiting.
      return absl::FailedPreconditionError(claim_.refusal.message());
    } else if (now - claim_.sent >= (claim_.refusal.ok() ? kResend : kResendNotFound)) {
      claim_.sent = now;
      send = true;
    }
    if (!send && !claim_.refusal.ok()) {
      return absl::UnavailableError(
          absl::StrCat("waiting for attached job '", job_name, "': ", claim_.refusal.message()));
    }
    if (send) claim_.refusal = absl::OkStatus();
  }
  if (send) {
    v1::WorkerMessage m;
    m.mutable_claim()->set_job_name(job_name);
    m.mutable_claim()->set_rank(rank);
    if (absl::Status s = session_->Send(m); !s.ok()) {
      return absl::UnavailableError(absl::StrCat("cannot claim rank ", rank, " of attached job '",
                                                 job_name, "' yet: ", s.message()));
    }
  }
  return absl::UnavailableError(absl::StrCat("rank ", rank, " of attached job '", job_name,
                                             "' claimed on this worker: the job starts when all "
                                             "its ranks are claimed"));
}

absl::StatusOr<LocalServer::Handler::Welcome> Daemon::OnHello(const v1::LocalHello& hello,
                                                              const PeerCredentials& peer) {
  // The kernel's word, not the hello's: a process of another user must not get the job's arena,
  // nor may a process claim another's pid.
  if (peer.uid != geteuid() && peer.uid != 0 &&
      std::find(options_.attach_uids.begin(), options_.attach_uids.end(), peer.uid) ==
          options_.attach_uids.end()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "uid ", peer.uid, " may not attach: this daemon serves the processes of its own user (uid ",
        geteuid(), "), root and --attach-uid's"));
  }
  if (hello.pid() > 0 && hello.pid() != peer.pid) {
    return absl::PermissionDeniedError(absl::StrCat(
        "hello.pid ", hello.pid(), " is not the connecting process's (pid ", peer.pid, ")"));
  }
  std::shared_ptr<Job> job = ServingJob();
  if (job == nullptr || job->stopped) {
    if (!hello.attach_job().empty()) return ClaimRank(hello.attach_job(), hello.attach_rank());
    return absl::UnavailableError("no job is assigned to this worker yet");
  }
  const v1::Job& spec = job->assignment.job();
  const v1::RankInfo& me = spec.ranks(job->assignment.rank());
  if (hello.after_epoch() > 0 && job->assignment.epoch() <= hello.after_epoch()) {
    if (!job->elastic()) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", spec.id(),
                       " is not elastic (ringmaster submit --min-np/--max-np): its ranks "
                       "cannot reset into a new epoch"));
    }
    RequestReset(*job, absl::StrCat("its training process (pid ", peer.pid,
                                    ") reset and waits for the next epoch"));
    return absl::UnavailableError(absl::StrCat("waiting for an epoch of job ", spec.id(),
                                               " after epoch ", hello.after_epoch()));
  }
  if (!hello.attach_job().empty() &&
      (!spec.spec().attached() || spec.spec().name() != hello.attach_job() ||
       me.rank() != hello.attach_rank())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this worker serves rank ", me.rank(), " of job ", spec.id(), " ('", spec.spec().name(),
        "'), not rank ", hello.attach_rank(), " of attached job '", hello.attach_job(), "'"));
  }
  // Held until the welcome is built: FinishJob marks the job closing under it before it releases
  // the arena.
  absl::ReleasableMutexLock lock(&job->attach_mu);
  if (job->closing) return absl::UnavailableError("no job is assigned to this worker yet");
  const int pid = peer.pid > 0 ? peer.pid : -1;
  // A rank the daemon launched is served to that process or one it started, nothing else.
  if (!spec.spec().command().empty()) {
    const pid_t child = job->proc->child_pid.load();
    if (child == 0) return absl::UnavailableError("the rank's process is starting");
    if (!DescendsFrom(pid, child)) {
      return absl::PermissionDeniedError(
          absl::StrCat("pid ", pid, " is not rank ", me.rank(), "'s process (pid ", child,
                       ") nor one it started: only the job's own processes may attach"));
    }
  }
  auto other_attached = [&job, pid]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->attach_mu) {
    return job->attached_connections > 0 && (job->attached_pid != pid || pid == -1);
  };
  if (other_attached()) {
    // A process that has just exited (the previous command of `sh -c "a && b"`) may not have been
    // seen to go yet: its connection's reader sees the end of it at its own pace. Give it a moment.
    job->attach_mu.AwaitWithTimeout(
        absl::Condition(
            +[](Job* j) ABSL_NO_THREAD_SAFETY_ANALYSIS { return j->attached_connections == 0; },
            job.get()),
        absl::Seconds(1));
  }
  if (job->closing) return absl::UnavailableError("no job is assigned to this worker yet");
  if (other_attached()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", me.rank(), " of job ", spec.id(), " already has a training process attached",
        job->attached_pid > 0 ? absl::StrCat(" (pid ", job->attached_pid, ")") : "",
        ": one process per rank (a process started by the training process, such as a "
        "DataLoader worker, must not call init())"));
  }
  const int arena_fd = fcntl(job->arena->fd(), F_DUPFD_CLOEXEC, 0);  // the server closes it
  if (arena_fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot share the job's arena: ", std::strerror(errno)));
  }
  job->attached_pid = pid;
  ++job->attached_connections;
  v1::LocalWelcome w;
  w.set_job_id(spec.id());
  w.set_epoch(job->assignment.epoch());
  w.set_rank(me.rank());
  w.set_size(spec.spec().np());
  w.set_local_rank(me.local_rank());
  w.set_local_size(me.local_size());
  w.set_cross_rank(me.cross_rank());
  w.set_cross_size(me.cross_size());
  w.set_host(me.host());
  w.set_arena_name(job->arena->name());
  w.set_arena_bytes(static_cast<int64_t>(job->arena->size()));
  w.set_client_bytes(static_cast<int64_t>(options_.arena_bytes / 4 * 3));
  if (job->gpu != nullptr) {
    w.set_device(cuda_device_ + 1);
    w.set_device_pci_bus_id(job->device_pci_bus_id);
    w.set_device_arena(job->device_arena_handle);
    for (const std::string& h : job->done_event_handles) w.add_done_events(h);
  }
  lock.Release();  // not held across the message to the coordinator
  // CPU slots: a process whose memory this daemon can read gets its tensors reduced where they
  // are (no staging through the arena).
  if (job->gpu == nullptr && hello.probe_address() != 0 && peer.pid > 0) {
    uint64_t seen = 0;
    iovec here{&seen, sizeof(seen)};
    iovec there{reinterpret_cast<void*>(hello.probe_address()), sizeof(seen)};
    if (process_vm_readv(peer.pid, &here, 1, &there, 1, 0) == sizeof(seen) &&
        seen == hello.probe_value()) {
      w.set_direct_access(true);
    } else {
      spdlog::info(
          "job {} rank {}: pid {} is served through the arena (its memory cannot be read "
          "here: {})",
          spec.id(), me.rank(), peer.pid, std::strerror(errno));
    }
  }
  if (!job->started.exchange(true)) SendRankUpdate(*job, v1::RANK_STATE_STARTED, 0, "");
  return Welcome{std::move(w), arena_fd};
}

void Daemon::OnEnqueue(const v1::LocalWelcome* welcome, const v1::LocalEnqueue& enqueue,
                       std::function<void(const v1::LocalCompletion&)> reply) {
  std::shared_ptr<Job> job = ServingJob();
  auto refuse = [&](absl::StatusCode code, std::string message) {
    v1::LocalCompletion c;
    c.set_handle(enqueue.handle());
    c.set_code(static_cast<int>(code));
    c.set_message(std::move(message));
    reply(c);
  };
  if (job == nullptr) {
    refuse(absl::StatusCode::kUnavailable, "no job is assigned to this worker");
    return;
  }
  // A connection welcomed into an elastic job's earlier epoch: its offsets are into that epoch's
  // arena, and its peers are gone.
  if (welcome != nullptr && (welcome->job_id() != job->assignment.job().id() ||
                             welcome->epoch() != job->assignment.epoch())) {
    refuse(absl::StatusCode::kAborted,
           absl::StrCat("job ", welcome->job_id(), " epoch ", welcome->epoch(),
                        " has ended: reset into the job's new epoch (hvd.elastic)"));
    return;
  }
  const uint64_t handle = enqueue.handle();
  LocalOp op;
  FromProto(enqueue, &op);
  if (op.address != 0) {
    if (welcome == nullptr || !welcome->direct_access()) {
      refuse(absl::StatusCode::kInvalidArgument,
             "enqueue.address needs a connection welcomed with direct_access");
      return;
    }
    absl::MutexLock lock(&job->attach_mu);
    op.pid = job->attached_pid;
  }
  job->engine->Enqueue(std::move(op),
                       [reply, handle, hosts_updated = job->hosts_updated](const OpResult& result) {
                         v1::LocalCompletion c;
                         ToProto(result, handle, &c);
                         if (hosts_updated->load()) c.set_hosts_updated(true);
                         reply(c);
                       });
}

void Daemon::OnRelease(const v1::LocalWelcome* welcome, const v1::LocalRelease& release) {
  std::shared_ptr<Job> job = ServingJob();
  if (job == nullptr || (welcome != nullptr && welcome->epoch() != job->assignment.epoch())) {
    return;  // an earlier epoch's output went with its arena
  }
  job->outputs->Free(static_cast<size_t>(release.offset())).IgnoreError();
}

void Daemon::OnDisconnect(const v1::LocalWelcome* welcome) {
  std::shared_ptr<Job> job = ServingJob();
  // A connection that never got a welcome (a probe, a process that arrived too early), or one of
  // an earlier job, changes nothing.
  if (welcome == nullptr || job == nullptr || welcome->job_id() != job->assignment.job().id() ||
      welcome->epoch() != job->assignment.epoch()) {
    return;
  }
  {
    absl::MutexLock lock(&job->attach_mu);
    // The process reconnected meanwhile: it is still here.
    if (--job->attached_connections > 0) return;
    job->attached_pid = 0;
  }
  // An attached training process (no command of ours) that goes away ends its rank.
  if (job->proc->child != nullptr || !job->started || job->stopped.exchange(true)) return;
  SendRankUpdate(*job, v1::RANK_STATE_EXITED, 0, "");
  job->engine->Abort(absl::CancelledError("the training process disconnected"));
  FinishJob(job);
}

}  // namespace ringmaster
