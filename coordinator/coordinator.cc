#include "coordinator/coordinator.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "coordinator/scheduler.h"
#include "spdlog/spdlog.h"

namespace ringmaster {
namespace {

std::string Placement(const RankInfo& r) {
  return absl::StrCat("rank ", r.rank, " on host ", r.host, " (", r.worker_id, ")");
}

}  // namespace

Coordinator::Coordinator(CoordinatorOptions options)
    : clock_(options.clock),
      slow_(options.executor != nullptr ? *options.executor : Executor::Inline()),
      heartbeat_interval_(options.heartbeat_interval),
      housekeeping_interval_(options.housekeeping_interval),
      failure_settle_(options.failure_settle),
      start_timeout_(options.start_timeout),
      log_linger_(options.log_linger),
      jobs_(std::move(options.store), options.clock),
      workers_(options.clock, options.lease, options.reconnect_grace),
      logs_(LogStoreOptions{.clock = options.clock,
                            .max_bytes_per_rank = options.log_bytes_per_rank,
                            .max_total_bytes = options.log_bytes_total}),
      artifacts_(std::move(options.artifacts_dir)) {
  RegisterCollectors();
}

void Coordinator::RegisterCollectors() {
  metrics_.AddCollector([this] {
    std::map<JobState, int> jobs;
    for (const Job& job : jobs_.List({})) ++jobs[job.state];
    for (JobState state : {JobState::kPending, JobState::kStarting, JobState::kRunning,
                           JobState::kSucceeded, JobState::kFailed, JobState::kCancelled}) {
      metrics_
          .GetGauge("ringmaster_jobs", "Jobs known to the coordinator, by state.",
                    {{"state", absl::AsciiStrToLower(JobStateName(state))}})
          .Set(jobs[state]);
    }
    std::map<std::string, int> workers;
    for (const Worker& w : workers_.List()) {
      ++workers[w.state == WorkerState::kLost   ? "lost"
                : !w.connected                  ? "disconnected"
                : w.state == WorkerState::kBusy ? "busy"
                                                : "idle"];
    }
    for (const char* state : {"idle", "busy", "disconnected", "lost"}) {
      metrics_
          .GetGauge("ringmaster_workers", "Registered worker daemons, by state.",
                    {{"state", state}})
          .Set(workers[state]);
    }
  });
}

Coordinator::~Coordinator() = default;

absl::StatusOr<Job> Coordinator::RegisterJob(JobSpec spec) {
  absl::StatusOr<Job> job = jobs_.Register(std::move(spec));
  if (!job.ok()) return job;
  spdlog::info("job {} '{}' registered: np={}", job->id, job->spec.name, job->spec.np);
  Schedule();
  return GetJob(job->id);
}

absl::StatusOr<Worker> Coordinator::RegisterWorker(std::string host, std::string device,
                                                   std::map<std::string, std::string> labels) {
  absl::StatusOr<Worker> w =
      workers_.Register(std::move(host), std::move(device), std::move(labels));
  if (w.ok()) spdlog::info("worker {} registered: host {} device {}", w->id, w->host, w->device);
  return w;
}

WorkerChannel* Coordinator::ChannelOf(const std::string& worker_id) {
  auto it = channels_.find(worker_id);
  return it == channels_.end() ? nullptr : it->second;
}

std::optional<Job> Coordinator::PlaceOne() {
  absl::MutexLock schedule_lock(&schedule_mu_);
  std::vector<Job> pending = jobs_.List({JobState::kPending});
  std::reverse(pending.begin(), pending.end());  // oldest first
  // Forget jobs that are no longer pending (started, cancelled).
  absl::flat_hash_set<std::string> pending_ids;
  for (const Job& job : pending) pending_ids.insert(job.id);
  absl::erase_if(waiting_,
                 [&pending_ids](const auto& entry) { return !pending_ids.contains(entry.first); });
  for (const Job& job : pending) {
    absl::StatusOr<std::vector<RankInfo>> ranks =
        GangSchedule(workers_.Available(), job.spec.np, job.spec.processes_per_host);
    if (!ranks.ok()) {
      // Watchers see why it waits, each time that changes.
      std::string why = WaitingReason(workers_.List(), job.spec.np, job.spec.processes_per_host,
                                      job.spec.knobs.backend);
      // At most kMaxWaitingEvents per job (workers coming and going change the counts); `status`
      // always has the reason as it is.
      Waiting& w = waiting_[job.id];
      if (!why.empty() && w.reason != why && w.events < kMaxWaitingEvents) {
        ++w.events;
        jobs_
            .AddEvent(job.id,
                      w.events == kMaxWaitingEvents
                          ? absl::StrCat("waiting: ", why, " (further changes only in status)")
                          : absl::StrCat("waiting: ", why))
            .IgnoreError();
        w.reason = std::move(why);
      }
      continue;
    }
    waiting_.erase(job.id);
    std::vector<std::string> ids;
    std::vector<int32_t> numbers;
    for (const RankInfo& r : *ranks) {
      ids.push_back(r.worker_id);
      numbers.push_back(r.rank);
    }
    if (!workers_.Assign(ids, job.id, numbers).ok()) continue;
    std::vector<std::string> hosts;
    for (const RankInfo& r : *ranks) {
      if (hosts.empty() || hosts.back() != r.host) hosts.push_back(r.host);
    }
    absl::StatusOr<Job> started =
        jobs_.Start(job.id, *ranks,
                    absl::StrCat("scheduled ", ranks->size(), " ranks on ", hosts.size(),
                                 " hosts: ", absl::StrJoin(hosts, ", ")));
    if (!started.ok()) {  // cancelled meanwhile
      for (const std::string& id : ids) workers_.Release(id);
      continue;
    }
    {
      absl::MutexLock lock(&mu_);
      starting_since_[started->id] = clock_->Now();
    }
    return *started;
  }
  return std::nullopt;
}

void Coordinator::Schedule() {
  // One job at a time: its workers are marked busy under schedule_mu_, so the next placement sees
  // them taken; its runtime's files are created after the lock is released, by the executor (file
  // I/O has no place on a gRPC callback thread).
  while (std::optional<Job> started = PlaceOne()) {
    slow_.Post([this, job = *std::move(started)] { StartPlaced(job); });
  }
}

void Coordinator::StartPlaced(const Job& job) {
  // Cancelled meanwhile: no files, no series, no assignments.
  if (absl::StatusOr<Job> now = jobs_.Get(job.id);
      !now.ok() || IsTerminal(now->state) || now->epoch != job.epoch) {
    return;
  }
  std::vector<std::string> problems;
  std::shared_ptr<JobRuntime> runtime =
      JobRuntime::Open(job, artifacts_, metrics_, slow_, clock_->Now(), &problems);
  for (const std::string& problem : problems) {
    spdlog::error("job {}: {}", job.id, problem);
    jobs_.AddEvent(job.id, problem).IgnoreError();
  }
  spdlog::info("job {} starting on {} workers", job.id, job.ranks.size());
  {
    absl::MutexLock lock(&mu_);
    // Cancelled (or failed) since it was placed: Finish() found no runtime to stop; none is added.
    if (absl::StatusOr<Job> now = jobs_.Get(job.id);
        now.ok() && !IsTerminal(now->state) && now->epoch == job.epoch) {
      runtimes_[job.id] = runtime;
      for (const RankInfo& r : job.ranks) {
        if (WorkerChannel* channel = ChannelOf(r.worker_id)) channel->SendAssignment(job, r.rank);
      }
      return;
    }
  }
  runtime->Close();  // with no lock held: file I/O
}
absl::StatusOr<Job> Coordinator::Finish(const std::string& job_id, JobState state,
                                        std::string reason, const std::string& except_worker) {
  // The job's artifacts are complete before it turns terminal, so a user who sees it end and
  // fetches them gets them whole (what ranks still send is dropped).
  std::shared_ptr<JobRuntime> running = RuntimeOf(job_id);
  std::optional<JobThroughput> last_figures;
  if (running != nullptr) {
    // What `status` keeps showing once the job has ended: its rates over the window that ends at
    // its last negotiation cycle.
    last_figures = running->Throughput(absl::InfiniteFuture());
    // Its files are complete (file I/O, with no lock held) before it turns terminal; what ranks
    // send afterwards is dropped.
    running->Close();
  }
  absl::StatusOr<Job> job = jobs_.Transition(job_id, state, reason, std::move(last_figures));
  if (!job.ok()) return job;
  if (state == JobState::kFailed) {
    spdlog::warn("job {} failed: {}", job_id, reason);
  } else {
    spdlog::info("job {} {}: {}", job_id, JobStateName(state), reason);
  }
  std::shared_ptr<JobRuntime> ended;  // destroyed after mu_ is released
  {
    absl::MutexLock lock(&mu_);
    if (auto it = runtimes_.find(job_id); it != runtimes_.end()) {
      ended = std::move(it->second);
      runtimes_.erase(it);
    }
    pending_failures_.erase(job_id);
    starting_since_.erase(job_id);
    for (const RankInfo& r : job->ranks) {
      if (r.worker_id == except_worker) continue;
      if (WorkerChannel* channel = ChannelOf(r.worker_id)) channel->SendStopJob(job_id, reason);
    }
  }
  for (const RankInfo& r : job->ranks) workers_.Release(r.worker_id);
  rendezvous_.DropScope(RendezvousStore::Scope(job_id, job->epoch),
                        absl::StrCat("job ", job_id, " ended: ", reason));
  // After the transition: a follower that sees the log end finds the job terminal. Ranks that had
  // not exited may still have output on its way.
  const bool all_exited = std::all_of(job->ranks.begin(), job->ranks.end(), [](const RankInfo& r) {
    return r.state == RankState::kExited;  // not kStopped: those were running until now
  });
  logs_.End(job_id, all_exited ? absl::ZeroDuration() : log_linger_);
  Schedule();
  return job;
}

absl::StatusOr<Job> Coordinator::CancelJob(const std::string& id, std::string reason) {
  if (reason.size() > 1024) {
    return absl::InvalidArgumentError("reason is longer than 1024 bytes");
  }
  if (absl::StatusOr<Job> job = jobs_.Get(id); !job.ok()) return job.status();
  return Finish(id, JobState::kCancelled,
                reason.empty() ? "cancelled by user" : absl::StrCat("cancelled: ", reason));
}

void Coordinator::CancelJob(const std::string& id, std::string reason,
                            std::function<void(absl::StatusOr<Job>)> done) {
  if (reason.size() > 1024) {
    done(absl::InvalidArgumentError("reason is longer than 1024 bytes"));
    return;
  }
  if (absl::StatusOr<Job> job = jobs_.Get(id); !job.ok()) {
    done(job.status());
    return;
  }
  slow_.Post([this, id, reason = std::move(reason), done = std::move(done)]() mutable {
    done(CancelJob(id, std::move(reason)));
  });
}

void Coordinator::FinishLater(const std::string& job_id, JobState state, std::string reason,
                              const std::string& except_worker) {
  slow_.Post([this, job_id, state, reason = std::move(reason), except_worker]() mutable {
    Finish(job_id, state, std::move(reason), except_worker).IgnoreError();  // it may have ended
  });
}

absl::Status Coordinator::OpenSession(const std::string& worker_id, WorkerChannel* channel) {
  absl::StatusOr<Worker> worker = workers_.Get(worker_id);
  if (!worker.ok()) return worker.status();
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = workers_.SetConnected(worker_id, true); !s.ok()) return s;
    if (WorkerChannel* old = ChannelOf(worker_id); old != nullptr && old != channel) {
      old->Close(absl::AbortedError("superseded by a newer session of the same worker"));
    }
    channels_[worker_id] = channel;
    // A worker that reconnects while serving a job gets its assignment again.
    if (!worker->job_id.empty()) {
      if (auto it = runtimes_.find(worker->job_id); it != runtimes_.end()) {
        if (absl::StatusOr<Job> job = jobs_.Get(worker->job_id); job.ok()) {
          channel->SendAssignment(*job, worker->rank);
        }
      }
    }
  }
  spdlog::info("worker {} ({}) connected", worker_id, worker->host);
  Schedule();
  return absl::OkStatus();
}

void Coordinator::CloseSession(const std::string& worker_id, WorkerChannel* channel) {
  {
    absl::MutexLock lock(&mu_);
    auto it = channels_.find(worker_id);
    if (it == channels_.end() || it->second != channel) return;
    channels_.erase(it);
    // Under mu_, so a quick reconnect's OpenSession (which marks it connected under mu_ too)
    // cannot be overtaken. It may reconnect: an idle worker until its lease runs out, a busy one
    // within the reconnect grace.
    workers_.SetConnected(worker_id, false).IgnoreError();
  }
  absl::StatusOr<Worker> w = workers_.Get(worker_id);
  if (w.ok()) {
    spdlog::info("worker {} on host {} ({}) disconnected; {}", worker_id, w->host, w->device,
                 w->job_id.empty()
                     ? absl::StrCat("it is lost unless it reconnects within its lease")
                     : absl::StrCat("it served rank ", w->rank, " of job ", w->job_id));
  }
  Schedule();  // a pending job's reason to wait counts idle workers
  if (w.ok() && !w->job_id.empty()) {
    jobs_
        .AddEvent(w->job_id, absl::StrCat("worker ", worker_id, " serving rank ", w->rank,
                                          " on host ", w->host, " disconnected"))
        .IgnoreError();
    // A rank's failure waiting to settle was this worker's doing: name it now (on the executor:
    // ending a job closes its files).
    slow_.Post([this, job_id = w->job_id] { SettleFailures(clock_->Now(), job_id); });
  }
}

absl::Status Coordinator::Heartbeat(const std::string& worker_id) {
  return workers_.Heartbeat(worker_id);
}

absl::StatusOr<std::shared_ptr<JobRuntime>> Coordinator::RuntimeFor(const std::string& worker_id,
                                                                    const std::string& job_id,
                                                                    int64_t epoch, int32_t rank) {
  {
    absl::MutexLock lock(&mu_);
    auto it = runtimes_.find(job_id);
    if (it != runtimes_.end()) {
      const std::shared_ptr<JobRuntime>& runtime = it->second;
      if (epoch != runtime->epoch()) {
        return absl::AbortedError(absl::StrCat("epoch ", epoch, " of job ", job_id,
                                               " is stale; the job is at epoch ",
                                               runtime->epoch()));
      }
      if (rank < 0 || rank >= static_cast<int32_t>(runtime->ranks().size()) ||
          runtime->ranks()[rank].worker_id != worker_id) {
        return absl::FailedPreconditionError(
            absl::StrCat("worker ", worker_id, " is not assigned rank ", rank, " of job ", job_id));
      }
      return runtime;
    }
  }
  absl::StatusOr<Job> job = jobs_.Get(job_id);
  if (!job.ok()) return job.status();
  return absl::FailedPreconditionError(absl::StrCat("worker ", worker_id, " is not assigned rank ",
                                                    rank, " of job ", job_id, ", which is ",
                                                    JobStateName(job->state)));
}

absl::Status Coordinator::SubmitRequests(const std::string& worker_id, RequestBatch batch) {
  auto runtime = RuntimeFor(worker_id, batch.job_id, batch.epoch, batch.rank);
  if (!runtime.ok()) return runtime.status();
  const absl::Time now = clock_->Now();
  (*runtime)->Submit(batch.rank, std::move(batch.requests), batch.cached_ids, now);
  Flush(**runtime, now);
  // A cycle that is not due yet (some ranks have not submitted) must be flushed at its deadline.
  if (const absl::Time next = (*runtime)->NextDeadline(); next != absl::InfiniteFuture()) {
    WakeTicker(next);
  }
  return absl::OkStatus();
}

void Coordinator::Flush(JobRuntime& runtime, absl::Time now) {
  runtime.Flush(now, [this, &runtime](const std::shared_ptr<CycleBroadcast>& cycle) {
    absl::MutexLock lock(&mu_);
    for (const RankInfo& r : runtime.ranks()) {
      if (WorkerChannel* channel = ChannelOf(r.worker_id)) channel->SendResponses(cycle, r.rank);
    }
  });
}
absl::Status Coordinator::RecordTimeline(const std::string& worker_id, const std::string& job_id,
                                         int64_t epoch, int32_t rank,
                                         std::vector<ExecutionSpan> spans) {
  auto runtime = RuntimeFor(worker_id, job_id, epoch, rank);
  if (!runtime.ok()) return runtime.status();
  (*runtime)->RecordExecution(rank, std::move(spans));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ArtifactInfo>> Coordinator::ListArtifacts(
    const std::string& job_id) const {
  if (absl::StatusOr<Job> job = jobs_.Get(job_id); !job.ok()) return job.status();
  std::vector<ArtifactInfo> list = artifacts_.List(job_id);
  // A timeline being written is listed at the size a read would serve.
  if (std::shared_ptr<JobRuntime> runtime = RuntimeOf(job_id); runtime != nullptr) {
    if (std::optional<JobRuntime::TimelineSnapshot> timeline = runtime->Timeline()) {
      for (ArtifactInfo& a : list) {
        if (a.name == timeline->name) {
          a.size_bytes = timeline->stable_size + static_cast<int64_t>(std::strlen(Timeline::kTail));
        }
      }
    }
  }
  return list;
}

std::shared_ptr<JobRuntime> Coordinator::RuntimeOf(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = runtimes_.find(job_id);
  return it != runtimes_.end() ? it->second : nullptr;
}

absl::StatusOr<Coordinator::ArtifactSnapshot> Coordinator::SnapshotArtifact(
    const std::string& job_id, const std::string& name) const {
  if (absl::StatusOr<Job> job = jobs_.Get(job_id); !job.ok()) return job.status();
  if (std::shared_ptr<JobRuntime> runtime = RuntimeOf(job_id); runtime != nullptr) {
    if (std::optional<JobRuntime::TimelineSnapshot> t = runtime->Timeline(); t && t->name == name) {
      return ArtifactSnapshot{t->stable_size, Timeline::kTail};
    }
  }
  for (const ArtifactInfo& a : artifacts_.List(job_id)) {
    if (a.name == name) return ArtifactSnapshot{a.size_bytes, ""};
  }
  return absl::NotFoundError(absl::StrCat("job ", job_id, " has no artifact '", name, "'"));
}

std::vector<Job> Coordinator::ListJobs(const std::vector<JobState>& states) const {
  std::vector<Job> jobs = jobs_.List(states);
  std::vector<Worker> workers;
  for (Job& job : jobs) {
    if (job.state != JobState::kPending) continue;
    if (workers.empty()) workers = workers_.List();
    job.waiting_reason =
        WaitingReason(workers, job.spec.np, job.spec.processes_per_host, job.spec.knobs.backend);
  }
  return jobs;
}

absl::StatusOr<Job> Coordinator::GetJob(const std::string& id) const {
  absl::StatusOr<Job> job = jobs_.Get(id);
  if (!job.ok()) return job;
  if (job->state == JobState::kPending) {
    job->waiting_reason = WaitingReason(workers_.List(), job->spec.np, job->spec.processes_per_host,
                                        job->spec.knobs.backend);
  }
  std::shared_ptr<JobRuntime> runtime = RuntimeOf(id);
  if (runtime == nullptr) return job;  // an ended job keeps its last figures
  job->throughput = runtime->Throughput(clock_->Now());
  return job;
}

absl::Status Coordinator::UpdateRank(const std::string& worker_id, const RankUpdate& update) {
  auto runtime = RuntimeFor(worker_id, update.job_id, update.epoch, update.rank);
  if (!runtime.ok()) return runtime.status();
  if (update.message.size() > 4096) {
    return absl::InvalidArgumentError("rank_update.message is longer than 4096 bytes");
  }
  // A rank exits once: its first report stands (a rank whose data plane failed may see its
  // process exit, even with 0, afterwards).
  if (update.state == RankState::kExited) {
    if (absl::StatusOr<Job> known = jobs_.Get(update.job_id);
        known.ok() && update.rank >= 0 && update.rank < static_cast<int>(known->ranks.size()) &&
        known->ranks[update.rank].state == RankState::kExited) {
      return absl::OkStatus();
    }
  }
  absl::StatusOr<Job> job =
      jobs_.UpdateRank(update.job_id, update.rank, update.state, update.exit_code);
  if (!job.ok()) return job.status();
  const RankInfo& rank = job->ranks[update.rank];
  if (update.state == RankState::kStarted) {
    const bool all = std::all_of(job->ranks.begin(), job->ranks.end(),
                                 [](const RankInfo& r) { return r.state != RankState::kAssigned; });
    if (all && job->state == JobState::kStarting) {
      {
        absl::MutexLock lock(&mu_);
        starting_since_.erase(update.job_id);
      }
      return jobs_
          .Transition(update.job_id, JobState::kRunning,
                      absl::StrCat("all ", job->ranks.size(), " ranks started"))
          .status();
    }
    return absl::OkStatus();
  }
  if (update.state != RankState::kExited) {
    return absl::InvalidArgumentError("rank_update.state must be STARTED or EXITED");
  }
  if (update.exit_code != 0) {
    std::string reason =
        update.failed ? absl::StrCat(Placement(rank), " failed: ", update.message)
                      : absl::StrCat(Placement(rank), " exited with status ", update.exit_code);
    if (!update.failed && !update.message.empty()) absl::StrAppend(&reason, ": ", update.message);
    // A rank that fails because a peer's daemon died (its collective lost the peer) is a symptom,
    // and its report can beat the news of the dead peer's broken session by a few milliseconds: the
    // failure settles for failure_settle first, and names the disconnected worker if one shows up.
    // The reporting worker's process is gone, so it needs no stop; unless only its data plane
    // failed (`failed`): then its process runs on and is stopped with the others.
    // The rank's output is all here: a worker forwards it before reporting the exit.
    absl::StrAppend(&reason, OutputTail(update.job_id, update.rank));
    const std::string stopped_already = update.failed ? "" : worker_id;
    if (std::string cause = DisconnectedWorkerOf(*job, worker_id); !cause.empty()) {
      FinishLater(update.job_id, JobState::kFailed, absl::StrCat(cause, "; then ", reason),
                  stopped_already);
      return absl::OkStatus();
    }
    absl::MutexLock lock(&mu_);
    if (runtimes_.contains(update.job_id)) {
      // The first failure stands.
      pending_failures_.try_emplace(
          update.job_id,
          PendingFailure{std::move(reason), stopped_already, clock_->Now() + failure_settle_});
    }
    return absl::OkStatus();
  }
  const bool all_done = std::all_of(job->ranks.begin(), job->ranks.end(), [](const RankInfo& r) {
    return r.state == RankState::kExited && r.exit_code == 0;
  });
  if (all_done) {
    FinishLater(update.job_id, JobState::kSucceeded,
                absl::StrCat("all ", job->ranks.size(), " ranks exited 0"));
  }
  return absl::OkStatus();
}

absl::Status Coordinator::AppendOutput(const std::string& worker_id, const std::string& job_id,
                                       int64_t epoch, int32_t rank, OutputStream stream,
                                       std::string data) {
  if (auto runtime = RuntimeFor(worker_id, job_id, epoch, rank); !runtime.ok()) {
    // After the job's end, the worker that served the rank may still send the rank's last words;
    // the log store takes them until the job's log ends.
    absl::StatusOr<Job> job = jobs_.Get(job_id);
    const bool served = job.ok() && IsTerminal(job->state) && epoch == job->epoch && rank >= 0 &&
                        rank < static_cast<int32_t>(job->ranks.size()) &&
                        job->ranks[rank].worker_id == worker_id;
    if (!served) return runtime.status();
  }
  if (static_cast<int64_t>(data.size()) > kMaxOutputMessageBytes) {
    return absl::InvalidArgumentError(absl::StrCat("output.data of rank ", rank, " of job ", job_id,
                                                   " is ", data.size(), " bytes; at most ",
                                                   kMaxOutputMessageBytes, " per message"));
  }
  // The job's log may end between the check above and here; the store then refuses the chunk, so a
  // follower that saw the end has seen every chunk stored.
  return logs_.Append(job_id, rank, stream, std::move(data));
}

absl::Status Coordinator::CheckLogQuery(const std::string& job_id, int32_t rank) const {
  absl::StatusOr<Job> job = jobs_.Get(job_id);
  if (!job.ok()) return job.status();
  if (rank != LogStore::kAllRanks && (rank < 0 || rank >= job->spec.np)) {
    return absl::InvalidArgumentError(absl::StrCat("rank = ", rank, " is out of bounds [0, ",
                                                   job->spec.np - 1, "] of job ", job_id));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Coordinator::FollowLogs(const std::string& job_id,
                                                LogStore::Subscriber wake) {
  if (absl::StatusOr<Job> job = jobs_.Get(job_id); !job.ok()) return job.status();
  // Every job reaches its terminal state through Finish(), which ends its log (at once, or after
  // the linger), so a follower is woken at the end.
  return logs_.Subscribe(job_id, std::move(wake));
}

std::string Coordinator::OutputTail(const std::string& job_id, int32_t rank) const {
  const std::vector<std::string> lines = logs_.LastLines(job_id, rank, 5, 240);
  if (lines.empty()) return "";
  std::string out = "; its last output:";
  for (const std::string& line : lines) absl::StrAppend(&out, "\n  ", line);
  absl::StrAppend(&out, "\nsee all of it with: ringmaster logs ", job_id, " --rank ", rank);
  return out;
}

std::string Coordinator::DisconnectedWorkerOf(const Job& job, const std::string& except) {
  for (const RankInfo& other : job.ranks) {
    if (other.worker_id == except) continue;
    absl::StatusOr<Worker> w = workers_.Get(other.worker_id);
    if (!w.ok() || !w->connected) {
      return absl::StrCat("worker ", other.worker_id, " serving rank ", other.rank, " on host ",
                          other.host, " disconnected (its session broke)");
    }
  }
  return "";
}

void Coordinator::SettleFailures(absl::Time now, const std::string& disconnected_job) {
  std::vector<std::pair<std::string, PendingFailure>> due;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = pending_failures_.begin(); it != pending_failures_.end();) {
      if (now < it->second.deadline && it->first != disconnected_job) {
        ++it;
        continue;
      }
      due.emplace_back(it->first, std::move(it->second));  // taken: settled once
      pending_failures_.erase(it++);
    }
  }
  for (auto& [job_id, failure] : due) {
    std::string reason = std::move(failure.reason);
    if (absl::StatusOr<Job> job = jobs_.Get(job_id); job.ok()) {
      if (std::string cause = DisconnectedWorkerOf(*job, failure.worker_id); !cause.empty()) {
        reason = absl::StrCat(cause, "; then ", reason);
      }
    }
    FinishLater(job_id, JobState::kFailed, std::move(reason), failure.worker_id);
  }
}

absl::Status Coordinator::CheckScope(const std::string& job_id, int64_t epoch) const {
  absl::StatusOr<Job> job = jobs_.Get(job_id);
  if (!job.ok()) return job.status();
  if (job->state != JobState::kStarting && job->state != JobState::kRunning) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, " is ", JobStateName(job->state), "; its rendezvous is closed"));
  }
  if (epoch != job->epoch) {
    return absl::AbortedError(absl::StrCat("epoch ", epoch, " of job ", job_id,
                                           " is stale; the job is at epoch ", job->epoch));
  }
  return absl::OkStatus();
}

absl::Status Coordinator::RendezvousSet(const std::string& job_id, int64_t epoch,
                                        const std::string& key, std::string value) {
  if (absl::Status s = CheckScope(job_id, epoch); !s.ok()) return s;
  return rendezvous_.Set(RendezvousStore::Scope(job_id, epoch), key, std::move(value));
}

absl::StatusOr<std::string> Coordinator::RendezvousGet(const std::string& job_id, int64_t epoch,
                                                       const std::string& key) {
  if (absl::Status s = CheckScope(job_id, epoch); !s.ok()) return s;
  return rendezvous_.Get(RendezvousStore::Scope(job_id, epoch), key);
}

void Coordinator::RendezvousWait(const std::string& job_id, int64_t epoch,
                                 std::vector<std::string> keys, absl::Duration timeout,
                                 RendezvousStore::WaitCallback done) {
  if (absl::Status s = CheckScope(job_id, epoch); !s.ok()) {
    done(s);
    return;
  }
  if (timeout <= absl::ZeroDuration() || timeout > absl::Minutes(10)) {
    done(absl::InvalidArgumentError(absl::StrCat(
        "timeout_ms = ", absl::ToInt64Milliseconds(timeout), " is out of bounds [1, 600000]")));
    return;
  }
  rendezvous_.Wait(RendezvousStore::Scope(job_id, epoch), std::move(keys), clock_->Now() + timeout,
                   std::move(done));
}

void Coordinator::Tick() {
  const absl::Time now = clock_->Now();
  std::vector<std::shared_ptr<JobRuntime>> runtimes;
  bool housekeeping = false;
  {
    absl::MutexLock lock(&mu_);
    runtimes.reserve(runtimes_.size());
    for (auto& [id, runtime] : runtimes_) runtimes.push_back(runtime);
    if (now - last_housekeeping_ >= housekeeping_interval_) {
      last_housekeeping_ = now;
      housekeeping = true;
    }
  }
  for (const auto& runtime : runtimes) Flush(*runtime, now);
  SettleFailures(now, "");
  if (housekeeping) Housekeeping(now);
}

void Coordinator::WaitForTick(absl::Time deadline) {
  absl::MutexLock lock(&tick_mu_);
  tick_wake_ = std::min(tick_wake_, deadline);  // keeps a wake-up asked for while ticking
  while (absl::Now() < tick_wake_) {
    tick_cv_.WaitWithDeadline(&tick_mu_, tick_wake_);
  }
  tick_wake_ = absl::InfiniteFuture();
}

void Coordinator::WakeTicker(absl::Time when) {
  absl::MutexLock lock(&tick_mu_);
  if (when < tick_wake_) {
    tick_wake_ = when;
    tick_cv_.Signal();
  }
}

absl::Time Coordinator::NextDeadline() const {
  absl::Time next = absl::InfiniteFuture();
  absl::MutexLock lock(&mu_);
  for (const auto& [id, runtime] : runtimes_) {
    next = std::min(next, runtime->NextDeadline());
  }
  return next;
}

void Coordinator::Housekeeping(absl::Time now) {
  for (const Worker& w : workers_.ExpireLeases()) {
    const std::string& lost = w.lost_reason;
    spdlog::warn("worker {} on {} lost: {}", w.id, w.host, lost);
    {
      absl::MutexLock lock(&mu_);
      if (WorkerChannel* channel = ChannelOf(w.id)) {
        channel->Close(absl::FailedPreconditionError(
            absl::StrCat("worker ", w.id, " lost its lease (", lost, "); register again")));
        channels_.erase(w.id);
      }
    }
    if (w.job_id.empty()) Schedule();  // pending jobs' reasons count registered workers
    if (!w.job_id.empty()) {
      FinishLater(w.job_id, JobState::kFailed,
                  absl::StrCat("worker ", w.id, " serving rank ", w.rank, " on host ", w.host,
                               " was lost: ", lost));  // the job may have ended meanwhile
    }
  }
  std::vector<std::shared_ptr<JobRuntime>> runtimes;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, runtime] : runtimes_) runtimes.push_back(runtime);
  }
  for (const auto& runtime : runtimes) {
    StallReport report = runtime->Housekeeping(now);
    if (report.message.empty()) continue;
    spdlog::warn("{}", report.message);
    if (report.shutdown) {
      FinishLater(runtime->job_id(), JobState::kFailed, report.message);
    } else {
      jobs_.AddEvent(runtime->job_id(), report.message).IgnoreError();
    }
  }
  FailJobsThatDidNotStart(now);
  rendezvous_.ExpireWaiters(now);
  logs_.EndDue();
}

void Coordinator::FailJobsThatDidNotStart(absl::Time now) {
  std::vector<std::string> late;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = starting_since_.begin(); it != starting_since_.end();) {
      if (now - it->second < start_timeout_) {
        ++it;
        continue;
      }
      late.push_back(it->first);
      starting_since_.erase(it++);  // failed once
    }
  }
  for (const std::string& job_id : late) {
    absl::StatusOr<Job> job = jobs_.Get(job_id);
    if (!job.ok() || job->state != JobState::kStarting) continue;
    std::vector<std::string> missing;
    for (const RankInfo& r : job->ranks) {
      if (r.state == RankState::kAssigned) missing.push_back(Placement(r));
    }
    FinishLater(
        job_id, JobState::kFailed,
        absl::StrCat(missing.size() == 1 ? "1 rank" : absl::StrCat(missing.size(), " ranks"),
                     " did not start within ", absl::FormatDuration(start_timeout_), ": ",
                     absl::StrJoin(missing, ", ")));
  }
}

void Coordinator::Shutdown(const std::string& reason) {
  {
    // The daemons stay up: their sessions end UNAVAILABLE, which makes them reconnect (with
    // backoff) to whatever coordinator serves the address next.
    absl::MutexLock lock(&mu_);
    for (auto& [id, channel] : channels_) channel->Close(absl::UnavailableError(reason));
  }
  rendezvous_.AbortAll(reason);
}

}  // namespace ringmaster
