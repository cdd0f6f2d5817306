#include "worker/local/local_api.h"

#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "worker/job_runner.h"
#include "worker/negotiation/engine_wire.h"

namespace ringmaster {
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

absl::Status LocalApi::CheckPeer(const v1::LocalHello& hello, const PeerCredentials& peer) const {
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
  return absl::OkStatus();
}

absl::Status LocalApi::CheckHello(JobRunner& job, const v1::LocalHello& hello,
                                  const PeerCredentials& peer) const {
  const v1::Job& spec = job.assignment().job();
  const v1::RankInfo& me = spec.ranks(job.rank());
  if (hello.after_epoch() > 0 && job.epoch() <= hello.after_epoch()) {
    if (!job.elastic()) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", spec.id(),
                       " is not elastic (ringmaster submit --min-np/--max-np): its ranks "
                       "cannot reset into a new epoch"));
    }
    job.RequestReset(absl::StrCat("its training process (pid ", peer.pid,
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
  // A rank the daemon launched is served to that process or one it started, nothing else.
  if (!spec.spec().command().empty()) {
    const pid_t child = job.process()->pid();
    if (child == 0) return absl::UnavailableError("the rank's process is starting");
    const int pid = peer.pid > 0 ? peer.pid : -1;
    if (!DescendsFrom(pid, child)) {
      return absl::PermissionDeniedError(
          absl::StrCat("pid ", pid, " is not rank ", me.rank(), "'s process (pid ", child,
                       ") nor one it started: only the job's own processes may attach"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<LocalServer::Handler::Welcome> LocalApi::WelcomeInto(JobRunner& job) const {
  const int arena_fd = fcntl(job.arena().fd(), F_DUPFD_CLOEXEC, 0);  // the server closes it
  if (arena_fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot share the job's arena: ", std::strerror(errno)));
  }
  const v1::Job& spec = job.assignment().job();
  const v1::RankInfo& me = spec.ranks(job.rank());
  v1::LocalWelcome w;
  w.set_job_id(spec.id());
  w.set_epoch(job.epoch());
  w.set_rank(me.rank());
  w.set_size(spec.spec().np());
  w.set_local_rank(me.local_rank());
  w.set_local_size(me.local_size());
  w.set_cross_rank(me.cross_rank());
  w.set_cross_size(me.cross_size());
  w.set_host(me.host());
  w.set_arena_name(job.arena().name());
  w.set_arena_bytes(static_cast<int64_t>(job.arena().size()));
  w.set_client_bytes(static_cast<int64_t>(job.client_bytes()));
  if (job.gpu() != nullptr) {
    w.set_device(job.cuda_device() + 1);
    w.set_device_pci_bus_id(job.device().pci_bus_id);
    w.set_device_arena(job.device().arena_handle);
    for (const std::string& h : job.device().done_event_handles) w.add_done_events(h);
  }
  return Welcome{std::move(w), arena_fd};
}

bool LocalApi::CanReadMemory(const v1::LocalHello& hello, const PeerCredentials& peer) {
  if (hello.probe_address() == 0 || peer.pid <= 0) return false;
  uint64_t seen = 0;
  iovec here{&seen, sizeof(seen)};
  iovec there{reinterpret_cast<void*>(hello.probe_address()), sizeof(seen)};
  return process_vm_readv(peer.pid, &here, 1, &there, 1, 0) == sizeof(seen) &&
         seen == hello.probe_value();
}

absl::StatusOr<LocalServer::Handler::Welcome> LocalApi::OnHello(const v1::LocalHello& hello,
                                                                const PeerCredentials& peer) {
  if (absl::Status s = CheckPeer(hello, peer); !s.ok()) return s;
  std::shared_ptr<JobRunner> job = jobs_.ServingJob();
  if (job == nullptr || job->stopped()) {
    if (!hello.attach_job().empty()) return ClaimRank(hello.attach_job(), hello.attach_rank());
    return absl::UnavailableError("no job is assigned to this worker yet");
  }
  if (absl::Status s = CheckHello(*job, hello, peer); !s.ok()) return s;
  // Built under the attachment's lock: the rank's end closes it before it releases the arena.
  absl::StatusOr<Welcome> welcome;
  const int pid = peer.pid > 0 ? peer.pid : -1;
  if (absl::Status s = job->attachment().Admit(
          pid, absl::StrCat("rank ", job->rank(), " of job ", job->job_id()), absl::Seconds(1),
          [&] {
            welcome = WelcomeInto(*job);
            return welcome.status();
          });
      !s.ok()) {
    return s;
  }
  // CPU slots: a process whose memory this daemon can read gets its tensors reduced where they
  // are (no staging through the arena).
  if (job->gpu() == nullptr && hello.probe_address() != 0 && peer.pid > 0) {
    if (CanReadMemory(hello, peer)) {
      welcome->message.set_direct_access(true);
    } else {
      spdlog::info(
          "job {} rank {}: pid {} is served through the arena (its memory cannot be read here: "
          "{})",
          job->job_id(), job->rank(), peer.pid, std::strerror(errno));
    }
  }
  if (!job->MarkStarted()) job->SendRankUpdate(v1::RANK_STATE_STARTED, 0, "");
  return welcome;
}

void LocalApi::OnEnqueue(const v1::LocalWelcome* welcome, const v1::LocalEnqueue& enqueue,
                         std::function<void(const v1::LocalCompletion&)> reply) {
  std::shared_ptr<JobRunner> job = jobs_.ServingJob();
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
  if (welcome != nullptr &&
      (welcome->job_id() != job->job_id() || welcome->epoch() != job->epoch())) {
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
    op.pid = job->attachment().pid();
  }
  job->engine().Enqueue(
      std::move(op), [reply, handle, hosts_updated = job->hosts_updated()](const OpResult& result) {
        v1::LocalCompletion c;
        ToProto(result, handle, &c);
        if (hosts_updated->load()) c.set_hosts_updated(true);
        reply(c);
      });
}

void LocalApi::OnRelease(const v1::LocalWelcome* welcome, const v1::LocalRelease& release) {
  std::shared_ptr<JobRunner> job = jobs_.ServingJob();
  if (job == nullptr || (welcome != nullptr && welcome->epoch() != job->epoch())) {
    return;  // an earlier epoch's output went with its arena
  }
  job->outputs().Free(static_cast<size_t>(release.offset())).IgnoreError();
}

absl::Status LocalApi::OnReadyEvents(const v1::LocalReadyEvents& events) {
  std::shared_ptr<JobRunner> job = jobs_.ServingJob();
  if (job == nullptr || job->gpu() == nullptr) {
    return absl::FailedPreconditionError("no GPU job is being served");
  }
  return job->gpu()->OpenReadyEvents({events.handles().begin(), events.handles().end()});
}

void LocalApi::OnDisconnect(const v1::LocalWelcome* welcome) {
  std::shared_ptr<JobRunner> job = jobs_.ServingJob();
  // A connection that never got a welcome (a probe, a process that arrived too early), or one of
  // an earlier job, changes nothing.
  if (welcome == nullptr || job == nullptr || welcome->job_id() != job->job_id() ||
      welcome->epoch() != job->epoch()) {
    return;
  }
  // The process reconnected meanwhile: it is still here.
  if (!job->attachment().Leave()) return;
  // An attached training process (no command of ours) that goes away ends its rank.
  if (job->process()->launched() || !job->started() || job->MarkStopped()) return;
  job->SendRankUpdate(v1::RANK_STATE_EXITED, 0, "");
  job->engine().Abort(absl::CancelledError("the training process disconnected"));
  job->Finish();
}

void LocalApi::ClaimRefused(const v1::ClaimRefused& r) {
  absl::MutexLock lock(&claim_mu_);
  if (claim_.job_name != r.job_name() || claim_.rank != r.rank()) return;
  claim_.refusal = absl::Status(static_cast<absl::StatusCode>(r.code()), r.message());
  if (claim_.refusal.ok()) claim_.refusal = absl::UnknownError(r.message());
  // NOT_FOUND (the job is not submitted yet) is expected while processes wait for it.
  spdlog::log(claim_.refusal.code() == absl::StatusCode::kNotFound ? spdlog::level::debug
                                                                   : spdlog::level::warn,
              "claim of rank {} of attached job '{}' refused: {}", r.rank(), r.job_name(),
              r.message());
}

void LocalApi::ClaimsDone() {
  absl::MutexLock lock(&claim_mu_);
  claim_ = Claim{};
}

absl::Status LocalApi::ClaimRank(const std::string& job_name, int32_t rank) {
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
    if (absl::Status s = options_.send(m); !s.ok()) {
      return absl::UnavailableError(absl::StrCat("cannot claim rank ", rank, " of attached job '",
                                                 job_name, "' yet: ", s.message()));
    }
  }
  return absl::UnavailableError(absl::StrCat("rank ", rank, " of attached job '", job_name,
                                             "' claimed on this worker: the job starts when all "
                                             "its ranks are claimed"));
}

}  // namespace ringmaster
