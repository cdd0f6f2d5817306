// Coordinator, part 1 of 5: composition, registration, scheduling and the ends of jobs. The table
// of contents is coordinator.h; sessions, outputs, rendezvous and the ticker have their own files
// (coordinator_sessions.cc, coordinator_outputs.cc, coordinator_rendezvous.cc,
// coordinator_liveness.cc).
#include "coordinator/coordinator.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/secret.h"
#include "coordinator/scheduler.h"
#include "spdlog/spdlog.h"

namespace ringmaster {
Coordinator::Coordinator(CoordinatorOptions options)
    : clock_(options.clock),
      slow_(options.executor != nullptr ? *options.executor : Executor::Inline()),
      heartbeat_interval_(options.heartbeat_interval),
      housekeeping_interval_(options.housekeeping_interval),
      job_retention_(options.job_retention),
      max_ended_jobs_(options.max_ended_jobs),
      retention_check_(options.retention_check),
      failure_settle_(options.failure_settle),
      start_timeout_(options.start_timeout),
      resume_timeout_(options.resume_timeout),
      started_(options.clock->Now()),
      generation_(static_cast<uint64_t>(absl::ToUnixMicros(absl::Now())) | 1),
      log_linger_(options.log_linger),
      jobs_(std::move(options.store), options.clock,
            JobRegistry::Limits{
                .max_active = options.max_active_jobs,
                .max_active_per_user = options.max_active_jobs_per_user,
                .max_registrations_per_minute = options.max_registrations_per_minute}),
      workers_(options.clock, options.lease, options.reconnect_grace),
      logs_(LogStoreOptions{.clock = options.clock,
                            .max_bytes_per_rank = options.log_bytes_per_rank,
                            .max_total_bytes = options.log_bytes_total,
                            .journal = std::move(options.log_journal)}),
      artifacts_(options.artifacts_dir),
      sources_(absl::StrCat(options.artifacts_dir, "/.sources"), options.max_source_bytes),
      max_output_bytes_per_rank_(options.max_output_bytes_per_rank),
      max_output_files_per_rank_(options.max_output_files_per_rank) {
  RegisterCollectors();
  RestoreJobs();
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

absl::StatusOr<Job> Coordinator::RegisterJob(JobSpec spec, std::string owner) {
  if (!spec.source.sha256.empty() && !sources_.Has(spec.source.sha256)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "spec.source names archive ", spec.source.sha256, ", which the coordinator does not hold"));
  }
  absl::StatusOr<Job> job = jobs_.Register(std::move(spec), std::move(owner));
  if (!job.ok()) return job;
  spdlog::info("job {} '{}' registered{}: np={}", job->id, job->spec.name,
               job->owner.empty() ? std::string() : absl::StrCat(" by '", job->owner, "'"),
               job->spec.np);
  Schedule();
  return GetJob(job->id);
}

absl::StatusOr<Worker> Coordinator::RegisterWorker(std::string host, std::string device,
                                                   std::map<std::string, std::string> labels,
                                                   uint64_t incarnation, std::string address,
                                                   std::string identity, std::string slot) {
  absl::StatusOr<Worker> w =
      workers_.Register(std::move(host), std::move(device), std::move(labels), incarnation,
                        std::move(address), std::move(identity), std::move(slot));
  if (w.ok()) {
    spdlog::info(
        "worker {} registered: host {} device {} address {}{}", w->id, w->host, w->device,
        w->address.empty() ? "not known" : w->address,
        w->identity.empty() ? std::string() : absl::StrCat(" identity '", w->identity, "'"));
    // A worker it replaced (the same identity, host and device) is reported lost by the ticker.
    WakeTicker(absl::InfinitePast());
  }
  return w;
}

bool Coordinator::ServesJob(const std::string& worker_id, const std::string& job_id) const {
  absl::StatusOr<Worker> w = workers_.Get(worker_id);
  return w.ok() && w->state == WorkerState::kBusy && w->job_id == job_id;
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
  absl::erase_if(claims_,
                 [&pending_ids](const auto& entry) { return !pending_ids.contains(entry.first); });
  // Workers that attached processes claimed for an attached job are kept for it.
  absl::flat_hash_set<std::string> claimed;
  for (const auto& [job_id, ranks] : claims_) {
    for (const auto& [rank, worker_id] : ranks) claimed.insert(worker_id);
  }
  std::vector<Worker> available = workers_.Available();
  if (!claimed.empty()) {
    std::erase_if(available, [&claimed](const Worker& w) { return claimed.contains(w.id); });
  }
  for (const Job& job : pending) {
    if (job.spec.attached) {
      Waiting& w = waiting_[job.id];
      if (w.events == 0) {
        ++w.events;
        w.reason = "waiting for its ranks to be claimed by attached training processes";
        jobs_.AddEvent(job.id, w.reason).IgnoreError();
      }
      continue;  // placed by ClaimRank
    }
    // An elastic job starts with as many ranks as fit, from max_np down to min_np.
    const int most = job.spec.elastic()
                         ? std::min<int>(job.spec.max_np, static_cast<int>(available.size()))
                         : job.spec.np;
    const int least = job.spec.elastic() ? job.spec.min_np : job.spec.np;
    // An NCCL job runs on GPU slots only.
    const std::vector<Worker> slots = SlotsFor(available, job.spec.knobs.backend);
    absl::StatusOr<std::vector<RankInfo>> ranks =
        GangSchedule(slots, std::max(most, least), job.spec.processes_per_host);
    for (int np = most - 1; !ranks.ok() && np >= least; --np) {
      ranks = GangSchedule(slots, np, job.spec.processes_per_host);
    }
    if (!ranks.ok()) {
      // Watchers see why it waits, each time that changes.
      std::string why = WaitingReason(workers_.List(), least, job.spec.processes_per_host,
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
      SetRunDeadline(*started, clock_->Now());
    }
    return *started;
  }
  return std::nullopt;
}

absl::Status Coordinator::ClaimRank(const std::string& worker_id, const std::string& job_name,
                                    int32_t rank) {
  std::optional<Job> started;
  {
    absl::MutexLock schedule_lock(&schedule_mu_);
    std::optional<Job> job;
    for (Job& pending : jobs_.List({JobState::kPending})) {
      if (pending.spec.attached && pending.spec.name == job_name) {
        job = std::move(pending);
        break;
      }
    }
    if (!job.has_value()) {
      return absl::NotFoundError(
          absl::StrCat("no attached job named '", job_name.substr(0, 128),
                       "' is pending (submit one: ringmaster submit --attached --name ",
                       job_name.substr(0, 128), " --np N)"));
    }
    if (rank < 0 || rank >= job->spec.np) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is not a rank of job ",
                                                     job->id, " ('", job_name, "', np ",
                                                     job->spec.np, ")"));
    }
    std::vector<Worker> available = workers_.Available();
    absl::flat_hash_map<std::string, const Worker*> by_id;
    for (const Worker& w : available) by_id[w.id] = &w;
    if (!by_id.contains(worker_id)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "worker ", worker_id, " is not idle: it cannot take rank ", rank, " of job ", job->id));
    }
    std::map<int32_t, std::string>& claims = claims_[job->id];
    // Claims of workers that have gone (lost, or taken by another job) lapse.
    std::erase_if(claims, [&by_id](const auto& c) { return !by_id.contains(c.second); });
    for (const auto& [held, holder] : claims) {
      if (holder == worker_id && held != rank) {
        return absl::FailedPreconditionError(
            absl::StrCat("worker ", worker_id, " already holds rank ", held, " of job ", job->id,
                         ": one rank per worker (is one training process per slot attached?)"));
      }
      if (held == rank && holder != worker_id) {
        const Worker& other = *by_id[holder];
        return absl::AlreadyExistsError(absl::StrCat("rank ", rank, " of job ", job->id,
                                                     " is claimed by worker ", holder, " on ",
                                                     other.host, " already"));
      }
    }
    if (claims.emplace(rank, worker_id).second) {
      spdlog::info("job {}: rank {} claimed on {} ({}), {} of {}", job->id, rank,
                   by_id[worker_id]->host, worker_id, claims.size(), job->spec.np);
    }
    if (static_cast<int32_t>(claims.size()) < job->spec.np) return absl::OkStatus();

    std::vector<Worker> by_rank;
    std::vector<std::string> ids;
    std::vector<int32_t> numbers;
    for (const auto& [r, id] : claims) {
      by_rank.push_back(*by_id[id]);
      ids.push_back(id);
      numbers.push_back(r);
    }
    absl::StatusOr<std::vector<RankInfo>> ranks = PlaceClaimed(by_rank);
    if (!ranks.ok()) return ranks.status();
    if (absl::Status s = workers_.Assign(ids, job->id, numbers); !s.ok()) return s;
    std::vector<std::string> hosts;
    for (const RankInfo& r : *ranks) {
      if (std::find(hosts.begin(), hosts.end(), r.host) == hosts.end()) hosts.push_back(r.host);
    }
    absl::StatusOr<Job> placed = jobs_.Start(
        job->id, *ranks,
        absl::StrCat("placed ", ranks->size(), " ranks where their processes attached, on ",
                     hosts.size(), " hosts: ", absl::StrJoin(hosts, ", ")));
    claims_.erase(job->id);
    waiting_.erase(job->id);
    if (!placed.ok()) {  // cancelled meanwhile
      for (const std::string& id : ids) workers_.Release(id);
      return placed.status();
    }
    {
      absl::MutexLock lock(&mu_);
      starting_since_[placed->id] = clock_->Now();
      SetRunDeadline(*placed, clock_->Now());
    }
    started = *std::move(placed);
  }
  slow_.Post([this, job = *std::move(started)] { StartPlaced(job); });
  return absl::OkStatus();
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
    resume_deadlines_.erase(job_id);
    run_deadlines_.erase(job_id);
    below_min_since_.erase(job_id);
    grow_notices_.erase(job_id);
    evicted_hosts_.erase(job_id);
    evicted_epoch_.erase(job_id);
    rank_notices_.erase(job_id);
    for (const RankInfo& r : job->ranks) {
      if (r.worker_id == except_worker) continue;
      // An elastic job's ranks may name a worker it let go of, now another job's.
      if (!ServesJob(r.worker_id, job_id)) continue;
      if (WorkerChannel* channel = ChannelOf(r.worker_id)) channel->SendStopJob(job_id, reason);
    }
  }
  for (const RankInfo& r : job->ranks) {
    if (ServesJob(r.worker_id, job_id)) workers_.Release(r.worker_id);
  }
  rendezvous_.DropScope(RendezvousStore::Scope(job_id, job->epoch),
                        absl::StrCat("job ", job_id, " ended: ", reason));
  // After the transition: a follower that sees the log end finds the job terminal. Ranks that had
  // not exited may still have output on its way.
  absl::flat_hash_set<int32_t> still_running;
  for (const RankInfo& r : job->ranks) {
    // Not kStopped: those ran until now. The rank of `except_worker` reported its exit already.
    if (r.state != RankState::kExited && r.worker_id != except_worker) still_running.insert(r.rank);
  }
  const bool all_exited = still_running.empty();
  if (!all_exited) {
    absl::MutexLock lock(&mu_);
    stopping_ranks_[job_id] = std::move(still_running);
  }
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

std::vector<Job> Coordinator::ListJobs(const std::vector<JobState>& states) const {
  std::vector<Job> jobs = jobs_.List(states);
  std::vector<Worker> workers;
  for (Job& job : jobs) {
    if (job.state != JobState::kPending) continue;
    if (workers.empty()) workers = workers_.List();
    job.waiting_reason = WaitingReason(workers, job.spec.elastic() ? job.spec.min_np : job.spec.np,
                                       job.spec.processes_per_host, job.spec.knobs.backend);
  }
  return jobs;
}

absl::StatusOr<Job> Coordinator::GetJob(const std::string& id) const {
  absl::StatusOr<Job> job = jobs_.Get(id);
  if (!job.ok()) return job;
  if (job->state == JobState::kPending) {
    job->waiting_reason =
        WaitingReason(workers_.List(), job->spec.elastic() ? job->spec.min_np : job->spec.np,
                      job->spec.processes_per_host, job->spec.knobs.backend);
  }
  std::shared_ptr<JobRuntime> runtime = RuntimeOf(id);
  if (runtime == nullptr) return job;  // an ended job keeps its last figures
  job->throughput = runtime->Throughput(clock_->Now());
  job->stragglers = runtime->Stragglers();
  return job;
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
