// Coordinator, part 6 of 6: resuming after a restart. A durable store says which jobs were
// starting or running when the coordinator went away; their daemons kept the ranks' processes and
// communicators and retry their sessions. Each job gets its workers back (not yet connected) and a
// runtime that restores: as each daemon reattaches it says what its rank holds, and once every rank
// is back the runtime gives a rank that lags the response lists the others executed, then starts a
// new response-cache generation in which every rank asks again for what it still waits for. The
// table of contents is coordinator.h.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/coordinator.h"
#include "spdlog/spdlog.h"

namespace ringmaster {

int Coordinator::RanksOf(const std::string& job_id) const {
  std::shared_ptr<JobRuntime> runtime = RuntimeOf(job_id);
  return runtime == nullptr ? 0 : static_cast<int>(runtime->ranks().size());
}

void Coordinator::RestoreJobs() {
  const absl::Time now = clock_->Now();
  std::vector<Job> all = jobs_.List({});
  std::reverse(all.begin(), all.end());  // oldest first
  // Worker ids are never used twice, even those of jobs long ended.
  for (const Job& job : all) {
    for (const RankInfo& r : job.ranks) workers_.ReserveId(r.worker_id);
    // Their logs (from the journal) are complete: readers and followers see them end (the oldest
    // first: they are dropped first when room runs out).
    if (IsTerminal(job.state)) logs_.End(job.id);
  }
  for (const Job& job : all) {
    if (job.state != JobState::kStarting && job.state != JobState::kRunning) continue;
    // Its end was recorded rank by rank but not yet the job's (a failure settles for a moment, a
    // success is posted): decided now, from what the store says.
    const auto failed = std::find_if(job.ranks.begin(), job.ranks.end(), [](const RankInfo& r) {
      return r.state == RankState::kExited && r.exit_code != 0;
    });
    if (failed != job.ranks.end()) {
      Finish(job.id, JobState::kFailed,
             absl::StrCat(Placement(*failed), " exited with status ", failed->exit_code,
                          OutputTail(job.id, failed->rank)))
          .IgnoreError();
      continue;
    }
    if (!job.ranks.empty() &&
        std::all_of(job.ranks.begin(), job.ranks.end(),
                    [](const RankInfo& r) { return r.state == RankState::kExited; })) {
      Finish(job.id, JobState::kSucceeded,
             absl::StrCat("all ", job.ranks.size(), " ranks exited 0"))
          .IgnoreError();
      continue;
    }
    absl::Status restored;
    for (const RankInfo& r : job.ranks) {
      restored.Update(workers_.Restore(r.worker_id, r.host, r.device, job.id, r.rank,
                                       now + resume_timeout_, r.address, r.worker_identity,
                                       r.worker_secret_sha256));
    }
    if (!restored.ok()) {  // a store that gives one worker two ranks: not resumable
      Finish(
          job.id, JobState::kFailed,
          absl::StrCat("the coordinator restarted and cannot resume the job: ", restored.message()))
          .IgnoreError();
      continue;
    }
    std::vector<std::string> problems;
    std::shared_ptr<JobRuntime> runtime =
        JobRuntime::Open(job, artifacts_, metrics_, slow_, now, &problems, /*restored=*/true);
    runtime->BeginRestore(generation_);
    for (const std::string& problem : problems) jobs_.AddEvent(job.id, problem).IgnoreError();
    {
      absl::MutexLock lock(&mu_);
      runtimes_[job.id] = runtime;
      resume_deadlines_[job.id] = now + resume_timeout_;
      if (job.state == JobState::kStarting) starting_since_[job.id] = now;
      // Counted from when its ranks were first assigned, the coordinator's restart included.
      absl::Time started = now;
      for (const JobEvent& e : job.events) {
        if (e.state == JobState::kStarting) {
          started = e.time;
          break;
        }
      }
      SetRunDeadline(job, started);
    }
    const std::string waiting = absl::StrCat(
        "the coordinator restarted; waiting up to ", absl::FormatDuration(resume_timeout_),
        " for the job's ", job.ranks.size(), " ranks to reattach");
    spdlog::info("job {}: {}", job.id, waiting);
    jobs_.AddEvent(job.id, waiting).IgnoreError();
  }
}

void Coordinator::GatherRank(const std::string& worker_id, JobRuntime& runtime, int32_t rank,
                             const RankResume* r) {
  const std::string& job_id = runtime.job_id();
  if (r != nullptr) {
    runtime.Gather(rank, r->last_response_seq, r->last_request_seq, r->retained);
    spdlog::info("worker {} reattached rank {} of job {} (it had response list {}, and kept {})",
                 worker_id, rank, job_id, r->last_response_seq, r->retained.size());
  } else if (absl::StatusOr<Job> job = jobs_.Get(job_id);
             job.ok() && job->ranks[rank].state == RankState::kAssigned) {
    // Its assignment never arrived (OpenSession sent it again): it starts from nothing.
    runtime.Gather(rank, 0, 0, {});
  } else {
    // Its process is ending (the worker reports how): it negotiates nothing more.
    runtime.Absent(rank);
    spdlog::info("worker {} reattached without rank {} of job {}", worker_id, rank, job_id);
  }
  TryEndRestore(job_id);
}

void Coordinator::TryEndRestore(const std::string& job_id) {
  std::shared_ptr<JobRuntime> runtime = RuntimeOf(job_id);
  if (runtime == nullptr || !runtime->restoring()) return;
  absl::StatusOr<Job> job = jobs_.Get(job_id);
  if (!job.ok()) return;
  for (int32_t rank : runtime->Ungathered()) {
    if (job->ranks[rank].state != RankState::kExited) return;  // still waiting for it
  }
  const std::vector<RankInfo>& ranks = runtime->ranks();
  uint64_t resent = 0;
  absl::StatusOr<bool> ended = runtime->EndRestore(
      [&](int32_t rank, const std::shared_ptr<CycleBroadcast>& cycle) {
        absl::MutexLock lock(&mu_);
        if (WorkerChannel* channel = ChannelOf(ranks[rank].worker_id)) {
          channel->SendResponses(cycle, rank);
          ++resent;
        }
      },
      [&](int32_t rank, uint64_t last_request_seq) {
        absl::MutexLock lock(&mu_);
        if (WorkerChannel* channel = ChannelOf(ranks[rank].worker_id)) {
          channel->SendResumed(job_id, runtime->epoch(), rank, last_request_seq);
        }
      });
  if (!ended.ok()) {
    FinishLater(job_id, JobState::kFailed, std::string(ended.status().message()));
    return;
  }
  if (!*ended) return;  // another reattach ended it
  {
    absl::MutexLock lock(&mu_);
    resume_deadlines_.erase(job_id);
  }
  const std::string resumed = absl::StrCat(
      "resumed after the coordinator restart: every rank reattached ",
      absl::FormatDuration(absl::Trunc(clock_->Now() - started_, absl::Milliseconds(1))),
      " after it started; ", resent,
      " response lists delivered, and each rank asks again for what "
      "it waits for (cache generation ",
      runtime->cache_generation(), ")");
  spdlog::info("job {} {}", job_id, resumed);
  jobs_.AddEvent(job_id, resumed).IgnoreError();
}

void Coordinator::NoteFirstCycleAfterRestore(JobRuntime& runtime) {
  std::optional<absl::Time> first = runtime.TakeFirstCycleAfterRestore();
  if (!first.has_value()) return;
  const std::string note =
      absl::StrCat("negotiating again: the first cycle after the restart came ",
                   absl::FormatDuration(absl::Trunc(*first - started_, absl::Milliseconds(1))),
                   " after the coordinator started");
  spdlog::info("job {}: {}", runtime.job_id(), note);
  jobs_.AddEvent(runtime.job_id(), note).IgnoreError();
}

void Coordinator::FailJobsThatDidNotResume(absl::Time now) {
  std::vector<std::string> late;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = resume_deadlines_.begin(); it != resume_deadlines_.end();) {
      if (now < it->second) {
        ++it;
        continue;
      }
      late.push_back(it->first);
      resume_deadlines_.erase(it++);  // failed once
    }
  }
  for (const std::string& job_id : late) {
    std::shared_ptr<JobRuntime> runtime = RuntimeOf(job_id);
    absl::StatusOr<Job> job = jobs_.Get(job_id);
    if (runtime == nullptr || !runtime->restoring() || !job.ok()) continue;
    std::vector<std::string> missing;
    for (int32_t rank : runtime->Ungathered()) {
      if (job->ranks[rank].state != RankState::kExited)
        missing.push_back(Placement(job->ranks[rank]));
    }
    if (missing.empty()) {  // every rank came back just now (or the rest exited): it resumes
      TryEndRestore(job_id);
      continue;
    }
    std::string reason = absl::StrCat(
        missing.size() == 1 ? "1 rank" : absl::StrCat(missing.size(), " ranks"),
        " did not reattach within ", absl::FormatDuration(resume_timeout_),
        " of the coordinator's restart (--resume-timeout): ", absl::StrJoin(missing, ", "));
    // A rank that failed meanwhile (its peer's daemon was gone) comes second.
    std::string stopped_already;
    {
      absl::MutexLock lock(&mu_);
      if (auto it = pending_failures_.find(job_id); it != pending_failures_.end()) {
        absl::StrAppend(&reason, "; then ", it->second.reason);
        stopped_already = it->second.worker_id;
        pending_failures_.erase(it);
      }
    }
    FinishLater(job_id, JobState::kFailed, std::move(reason), stopped_already);
  }
}

}  // namespace ringmaster
