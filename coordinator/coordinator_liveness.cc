// Coordinator, part 5 of 5: time. The ticker wakes for the next deadline and does housekeeping:
// lost workers, settled failures (a disconnect and the exits it causes become one reason), jobs
// that did not start in time, stalled and idle runtimes, logs past their linger.
#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/coordinator.h"
#include "spdlog/spdlog.h"

namespace ringmaster {

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
      // A restoring job's workers are not all back: the failure waits for the restore, whose end
      // names the ranks that did not come back (the likely cause).
      if ((now < it->second.deadline && it->first != disconnected_job) ||
          resume_deadlines_.contains(it->first)) {
        ++it;
        continue;
      }
      due.emplace_back(it->first, std::move(it->second));  // taken: settled once
      pending_failures_.erase(it++);
    }
  }
  for (auto& [job_id, failure] : due) {
    if (absl::StatusOr<Job> job = jobs_.Get(job_id); job.ok() && job->spec.elastic()) {
      // Not a failure: the job goes on in a new epoch without what it lost.
      // (A structured binding is captured through a copy: clang 14 refuses it in a capture list.)
      slow_.Post(
          [this, id = std::string(job_id), epoch = failure.epoch,
           why = std::move(failure.reason)]() mutable { Reshape(id, epoch, std::move(why)); });
      continue;
    }
    std::string reason = std::move(failure.reason);
    if (absl::StatusOr<Job> job = jobs_.Get(job_id); job.ok()) {
      if (std::string cause = DisconnectedWorkerOf(*job, failure.worker_id); !cause.empty()) {
        reason = absl::StrCat(cause, "; then ", reason);
      }
    }
    FinishLater(job_id, JobState::kFailed, std::move(reason), failure.worker_id);
  }
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

void Coordinator::Resumed(absl::Duration gap) {
  spdlog::warn(
      "the coordinator did not run for {} (stopped or starved): every worker's lease starts "
      "again instead of being judged by a silence that was the coordinator's own",
      absl::FormatDuration(absl::Trunc(gap, absl::Milliseconds(100))));
  workers_.RenewLeases();
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

void Coordinator::EvictEndedJobs(absl::Time now) {
  const std::vector<std::string> evicted = jobs_.Evict(now, job_retention_, max_ended_jobs_);
  for (const std::string& id : evicted) {
    {
      absl::MutexLock lock(&mu_);
      stopping_ranks_.erase(id);  // a rank whose worker died never reported its exit
    }
    logs_.Remove(id);
    artifacts_.Remove(id);
  }
  // A code archive goes with the last job that refers to it. One committed moments ago belongs to
  // a job being registered.
  std::set<std::string> referenced;
  for (const Job& job : jobs_.List({})) {
    if (!job.spec.source.sha256.empty()) referenced.insert(job.spec.source.sha256);
  }
  sources_.RemoveUnreferenced(referenced, absl::Minutes(10));
  if (!evicted.empty()) {
    spdlog::info("removed {} ended jobs past the retention ({} or {} ended jobs), the oldest {}",
                 evicted.size(), absl::FormatDuration(job_retention_), max_ended_jobs_,
                 evicted.front());
  }
}

void Coordinator::Housekeeping(absl::Time now) {
  bool check_retention = false;
  {
    absl::MutexLock lock(&mu_);
    if (now - last_retention_check_ >= retention_check_) {
      last_retention_check_ = now;
      check_retention = true;
    }
  }
  if (check_retention) slow_.Post([this, now] { EvictEndedJobs(now); });
  // Before leases: a restored worker that did not come back is lost at the same deadline, and the
  // job's reason should name every rank missing.
  FailJobsThatDidNotResume(now);
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
      std::string reason = absl::StrCat("worker ", w.id, " serving rank ", w.rank, " on host ",
                                        w.host, " was lost: ", lost);
      if (absl::StatusOr<Job> job = jobs_.Get(w.job_id); job.ok() && job->spec.elastic()) {
        NoteMembershipChange(w.job_id, job->epoch, std::move(reason));
      } else {
        FinishLater(w.job_id, JobState::kFailed, std::move(reason));  // it may have ended meanwhile
      }
    }
  }
  std::vector<std::shared_ptr<JobRuntime>> runtimes;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, runtime] : runtimes_) runtimes.push_back(runtime);
  }
  for (const auto& runtime : runtimes) {
    StallReport report = runtime->Housekeeping(now);
    ActOnStragglers(*runtime);
    if (report.message.empty()) continue;
    spdlog::warn("{}", report.message);
    if (report.shutdown) {
      FinishLater(runtime->job_id(), JobState::kFailed, report.message);
    } else {
      jobs_.AddEvent(runtime->job_id(), report.message).IgnoreError();
    }
  }
  FailJobsThatDidNotStart(now);
  FailJobsPastTheirTimeLimit(now);
  TendElasticJobs(now);
  rendezvous_.ExpireWaiters(now);
  logs_.EndDue();
}

void Coordinator::ActOnStragglers(JobRuntime& runtime) {
  std::optional<JobRuntime::StragglerNotice> named = runtime.TakeStragglerNotice();
  if (!named.has_value()) return;
  const std::string& action = runtime.straggler_action();
  spdlog::warn("job {}: {}", runtime.job_id(), named->message);
  if (action == "fail") {
    FinishLater(runtime.job_id(), JobState::kFailed,
                absl::StrCat(named->message, " (--straggler-action fail)"));
  } else if (action == "evict") {
    Evict(runtime, *named);
  } else {
    jobs_.AddEvent(runtime.job_id(), named->message).IgnoreError();
  }
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

void Coordinator::SetRunDeadline(const Job& job, absl::Time started) {
  if (job.spec.max_run_seconds <= 0) return;
  run_deadlines_.emplace(job.id, started + absl::Seconds(job.spec.max_run_seconds));
}

void Coordinator::FailJobsPastTheirTimeLimit(absl::Time now) {
  std::vector<std::string> due;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = run_deadlines_.begin(); it != run_deadlines_.end();) {
      if (now < it->second) {
        ++it;
        continue;
      }
      due.push_back(it->first);
      run_deadlines_.erase(it++);  // stopped once
    }
  }
  for (const std::string& job_id : due) {
    absl::StatusOr<Job> job = jobs_.Get(job_id);
    if (!job.ok() || IsTerminal(job->state)) continue;
    const int32_t limit = job->spec.max_run_seconds;
    FinishLater(job_id, JobState::kFailed,
                absl::StrCat("the job ran past its time limit of ", limit, " s (max_run_seconds, ",
                             "SageMaker's max_run) and was stopped"));
  }
}

}  // namespace ringmaster
