// Coordinator, part 6: elastic jobs (JobSpec::elastic, Horovod's --min-np/--max-np). Instead of
// failing, a job that loses a rank (its worker, its process) or whose rank resets starts a new
// epoch with the ranks it still has and the workers that are free: renumbered ranks (the
// survivors first, in their order, so rank 0 stays 0 where it survives), a new negotiator, new
// rendezvous data. Below min_np it waits for workers up to its elastic timeout; free workers make
// a running job grow at its ranks' next commit (HostsUpdated). The table of contents is
// coordinator.h.
#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/coordinator.h"
#include "coordinator/scheduler.h"
#include "spdlog/spdlog.h"

namespace ringmaster {

absl::Status Coordinator::ResetRank(const std::string& worker_id, const std::string& job_id,
                                    int64_t epoch, int32_t rank, const std::string& reason) {
  absl::StatusOr<std::shared_ptr<JobRuntime>> runtime = RuntimeFor(worker_id, job_id, epoch, rank);
  if (!runtime.ok()) {
    // A job waiting for workers (too few ranks) has no runtime: its next epoch comes when they do.
    absl::StatusOr<Job> job = jobs_.Get(job_id);
    if (job.ok() && job->spec.elastic() && job->epoch == epoch) return absl::OkStatus();
    return runtime.status();
  }
  absl::StatusOr<Job> job = jobs_.Get(job_id);
  if (!job.ok()) return job.status();
  if (!job->spec.elastic()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " is not elastic: its ranks cannot reset"));
  }
  if (job->epoch != epoch || rank >= static_cast<int32_t>(job->ranks.size())) {
    return absl::AbortedError(absl::StrCat("epoch ", epoch, " of job ", job_id, " has ended"));
  }
  const RankInfo& r = job->ranks[rank];
  NoteMembershipChange(job_id, epoch, absl::StrCat(Placement(r), " reset: ", reason));
  return absl::OkStatus();
}

void Coordinator::Evict(JobRuntime& runtime, const JobRuntime::StragglerNotice& notice) {
  const std::string& job_id = runtime.job_id();
  absl::StatusOr<Job> job = jobs_.Get(job_id);
  if (!job.ok() || IsTerminal(job->state) || !job->spec.elastic() ||
      job->epoch != runtime.epoch() || notice.rank < 0 ||
      notice.rank >= static_cast<int32_t>(job->ranks.size())) {
    return;  // the job moved on meanwhile
  }
  {
    absl::MutexLock lock(&mu_);
    int64_t& last = evicted_epoch_[job_id];
    if (last == job->epoch) return;  // this epoch evicted already: its new epoch comes
    last = job->epoch;
  }
  const std::string host = job->ranks[notice.rank].host;
  const double cooldown = job->spec.knobs.straggler_cooldown_seconds;
  std::string message = absl::StrCat(notice.message, " (--straggler-action evict): ");
  std::vector<std::string> gone;
  std::vector<std::string> released;
  for (const RankInfo& r : job->ranks) {
    // A slow link is its host's: every rank there goes.
    if (r.rank != notice.rank && !(notice.verdict == "slow link" && r.host == host)) continue;
    gone.push_back(Placement(r));
    if (ServesJob(r.worker_id, job_id)) released.push_back(r.worker_id);
  }
  absl::StrAppend(&message, absl::StrJoin(gone, ", "), gone.size() == 1 ? " leaves" : " leave",
                  " the job; host ", host, " is kept out of it for ", cooldown, " s");
  {
    absl::MutexLock lock(&mu_);
    evicted_hosts_[job_id][host] = clock_->Now() + absl::Seconds(cooldown);
    for (const std::string& id : released) {
      if (WorkerChannel* channel = ChannelOf(id)) channel->SendStopJob(job_id, message);
    }
  }
  for (const std::string& id : released) workers_.Release(id);
  spdlog::warn("job {}: {}", job_id, message);
  jobs_.AddEvent(job_id, message).IgnoreError();
  NoteMembershipChange(job_id, job->epoch, message);
}

void Coordinator::NoteMembershipChange(const std::string& job_id, int64_t epoch,
                                       std::string reason) {
  // Settled like a failure: a peer's death shows as a reset of the ranks that lost it a few
  // milliseconds before its own session breaks; the new epoch should leave that worker out.
  const absl::Time due = clock_->Now() + failure_settle_;
  {
    absl::MutexLock lock(&mu_);
    // The first change of an epoch stands; one of a later epoch replaces it.
    auto [it, added] =
        pending_failures_.try_emplace(job_id, PendingFailure{reason, "", due, epoch});
    if (!added && it->second.epoch < epoch) it->second = PendingFailure{reason, "", due, epoch};
  }
  WakeTicker(due);
}

namespace {

bool Busy(const absl::StatusOr<Worker>& w, const std::string& job_id) {
  return w.ok() && w->state == WorkerState::kBusy && w->job_id == job_id;
}

}  // namespace

std::vector<Worker> Coordinator::AddableWorkers(const Job& job, int members,
                                                const std::map<std::string, int>& per_host) {
  std::vector<Worker> available = workers_.Available();
  // Workers that attached processes claimed for an attached job are kept for it.
  absl::flat_hash_set<std::string> claimed;
  for (const auto& [id, ranks] : claims_) {
    for (const auto& [rank, holder] : ranks) claimed.insert(holder);
  }
  std::erase_if(available, [&claimed](const Worker& w) { return claimed.contains(w.id); });
  // Hosts evicted from the job (--straggler-action evict) stay out until their cool-down ends.
  absl::flat_hash_set<std::string> kept_out;
  {
    absl::MutexLock lock(&mu_);
    if (auto it = evicted_hosts_.find(job.id); it != evicted_hosts_.end()) {
      const absl::Time now = clock_->Now();
      for (const auto& [host, until] : it->second) {
        if (now < until) kept_out.insert(host);
      }
    }
  }
  std::erase_if(available, [&kept_out](const Worker& w) { return kept_out.contains(w.host); });
  std::sort(available.begin(), available.end(), [](const Worker& a, const Worker& b) {
    return std::tie(a.host, a.device, a.id) < std::tie(b.host, b.device, b.id);
  });
  std::map<std::string, int> on_host = per_host;
  std::vector<Worker> added;
  for (const Worker& w : available) {
    if (members + static_cast<int>(added.size()) >= job.spec.max_np) break;
    int& n = on_host[w.host];
    if (job.spec.processes_per_host > 0 && n >= job.spec.processes_per_host) continue;
    ++n;
    added.push_back(w);
  }
  return added;
}

void Coordinator::Reshape(const std::string& job_id, int64_t from_epoch, std::string why) {
  std::optional<Job> next;
  std::shared_ptr<JobRuntime> dropped;  // a job left waiting for workers negotiates nothing
  int64_t dropped_epoch = 0;
  std::optional<std::string> failure;  // ended with no lock held (Finish schedules)
  {
    absl::MutexLock schedule_lock(&schedule_mu_);
    absl::StatusOr<Job> job = jobs_.Get(job_id);
    if (!job.ok() || IsTerminal(job->state) || !job->spec.elastic() ||
        job->state == JobState::kPending) {
      return;
    }
    if (from_epoch > 0 && job->epoch != from_epoch) return;  // moved on already
    // The ranks that go on: connected workers still serving the job whose process has not exited.
    std::vector<Worker> members;
    std::vector<RankInfo> kept;
    std::vector<std::string> left;  // "rank 2 on host h (worker-3)" of the ranks that go
    std::map<std::string, int> per_host;
    for (const RankInfo& r : job->ranks) {
      absl::StatusOr<Worker> w = workers_.Get(r.worker_id);
      if (Busy(w, job_id) && w->connected && r.state != RankState::kExited) {
        members.push_back(*w);
        kept.push_back(r);
        ++per_host[w->host];
        continue;
      }
      left.push_back(Placement(r));
      // Its worker is free for other jobs (and for this one again: a slot whose process failed
      // starts a new one below).
      if (Busy(w, job_id)) workers_.Release(r.worker_id);
    }
    const int members_count = static_cast<int>(members.size());
    const std::vector<Worker> added = AddableWorkers(*job, members_count, per_host);
    const int total = members_count + static_cast<int>(added.size());
    if (total < job->spec.min_np) {
      bool first = false;
      {
        absl::MutexLock lock(&mu_);
        first = below_min_since_.try_emplace(job_id, clock_->Now()).second;
        if (auto it = runtimes_.find(job_id); it != runtimes_.end()) {
          dropped = std::move(it->second);
          runtimes_.erase(it);
          dropped_epoch = job->epoch;
        }
        pending_failures_.erase(job_id);
        for (const Worker& w : members) {
          if (WorkerChannel* channel = ChannelOf(w.id)) {
            channel->SendStopEpoch(job_id, job->epoch, why);
          }
        }
      }
      if (first) {
        const int32_t timeout = job->spec.elastic_timeout_seconds > 0
                                    ? job->spec.elastic_timeout_seconds
                                    : kDefaultElasticTimeoutSeconds;
        jobs_
            .AddEvent(job_id,
                      absl::StrCat("epoch ", job->epoch, " ended (", why, "); ", members_count,
                                   " ranks left, fewer than min_np ", job->spec.min_np,
                                   ": waiting up to ", timeout, " s for workers"))
            .IgnoreError();
        spdlog::warn("job {}: {} ranks left, fewer than min_np {}: waiting for workers", job_id,
                     members_count, job->spec.min_np);
      }
    } else if (job->spec.reset_limit > 0 && job->resets >= job->spec.reset_limit) {
      failure = absl::StrCat("reset limit ", job->spec.reset_limit,
                             " reached (--reset-limit): epoch ", job->epoch, " ended: ", why);
    } else {
      std::vector<Worker> order = members;
      order.insert(order.end(), added.begin(), added.end());
      absl::StatusOr<std::vector<RankInfo>> ranks = PlaceClaimed(order);
      std::vector<std::string> ids;
      std::vector<int32_t> numbers;
      for (size_t i = 0; i < added.size(); ++i) {
        ids.push_back(added[i].id);
        numbers.push_back(static_cast<int32_t>(kept.size() + i));
      }
      if (!ranks.ok()) {
        failure = std::string(ranks.status().message());
      } else if (!workers_.Assign(ids, job_id, numbers).ok()) {
        // Taken meanwhile (a registry change between Available and Assign): try again shortly.
        NoteMembershipChange(job_id, job->epoch, why);
        return;
      } else {
        for (size_t i = 0; i < kept.size(); ++i) {
          (*ranks)[i].state = kept[i].state;  // their processes run on
          workers_.Renumber(members[i].id, job_id, static_cast<int32_t>(i)).IgnoreError();
        }
        std::string message = absl::StrCat("epoch ", job->epoch + 1, ": ", total, " ranks (",
                                           members_count, " kept, ", added.size(), " added)");
        if (!left.empty()) absl::StrAppend(&message, "; gone: ", absl::StrJoin(left, ", "));
        absl::StrAppend(&message, "; because ", why);
        absl::StatusOr<Job> moved = jobs_.NextEpoch(job_id, *std::move(ranks), message);
        if (!moved.ok()) {
          for (const std::string& id : ids) workers_.Release(id);
          return;
        }
        spdlog::info("job {}: {}", job_id, message);
        next = *std::move(moved);
        absl::MutexLock lock(&mu_);
        below_min_since_.erase(job_id);
        grow_notices_.erase(job_id);
      }
    }
  }
  if (failure.has_value()) {
    FinishLater(job_id, JobState::kFailed, *std::move(failure));
    return;
  }
  if (dropped != nullptr) {
    dropped->Close();
    rendezvous_.DropScope(RendezvousStore::Scope(job_id, dropped_epoch),
                          absl::StrCat("job ", job_id, " epoch ", dropped_epoch, " ended"));
  }
  if (next.has_value()) StartNextEpoch(*next);
}

void Coordinator::StartNextEpoch(const Job& job) {
  std::vector<std::string> problems;
  std::shared_ptr<JobRuntime> runtime =
      JobRuntime::Open(job, artifacts_, metrics_, slow_, clock_->Now(), &problems,
                       /*restored=*/true);  // keeps its files
  for (const std::string& problem : problems) {
    if (job.resets == 1) jobs_.AddEvent(job.id, problem).IgnoreError();  // said once
  }
  std::shared_ptr<JobRuntime> old;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Job> now = jobs_.Get(job.id);
    if (!now.ok() || IsTerminal(now->state) || now->epoch != job.epoch) {
      old = std::move(runtime);  // ended or moved on meanwhile
    } else {
      if (auto it = runtimes_.find(job.id); it != runtimes_.end()) old = std::move(it->second);
      runtimes_[job.id] = runtime;
      // A failure of the epoch that ended is moot; one of this epoch settles on its own.
      if (auto it = pending_failures_.find(job.id);
          it != pending_failures_.end() && it->second.epoch < job.epoch) {
        pending_failures_.erase(it);
      }
      // Survivors switch to the new epoch (their pending collectives fail: Horovod's
      // HorovodInternalError); added workers start the job's command.
      for (const RankInfo& r : job.ranks) {
        if (WorkerChannel* channel = ChannelOf(r.worker_id)) channel->SendAssignment(job, r.rank);
      }
    }
  }
  if (old != nullptr) {
    const int64_t old_epoch = old->epoch();
    old->Close();
    if (old_epoch != job.epoch) {
      rendezvous_.DropScope(RendezvousStore::Scope(job.id, old_epoch),
                            absl::StrCat("job ", job.id, " epoch ", old_epoch, " ended"));
    }
  }
}

void Coordinator::TendElasticJobs(absl::Time now) {
  std::vector<Job> jobs = jobs_.List({JobState::kStarting, JobState::kRunning});
  std::erase_if(jobs, [](const Job& job) { return !job.spec.elastic(); });
  if (jobs.empty()) return;
  constexpr absl::Duration kGrowGrace = absl::Seconds(30);
  for (const Job& job : jobs) {
    std::optional<absl::Time> below_since;
    bool notice_due = false, notice_out = false;
    {
      absl::MutexLock lock(&mu_);
      if (auto it = below_min_since_.find(job.id); it != below_min_since_.end()) {
        below_since = it->second;
      }
      if (auto it = grow_notices_.find(job.id); it != grow_notices_.end()) {
        if (it->second.epoch != job.epoch) {
          grow_notices_.erase(it);
        } else {
          notice_out = true;
          notice_due = now >= it->second.deadline;
        }
      }
    }
    int members = 0;
    std::map<std::string, int> per_host;
    for (const RankInfo& r : job.ranks) {
      if (Busy(workers_.Get(r.worker_id), job.id) && r.state != RankState::kExited) {
        ++members;
        ++per_host[r.host];
      }
    }
    size_t addable;
    {
      absl::MutexLock schedule_lock(&schedule_mu_);
      addable = AddableWorkers(job, members, per_host).size();
    }
    if (below_since.has_value()) {
      const int32_t timeout = job.spec.elastic_timeout_seconds > 0
                                  ? job.spec.elastic_timeout_seconds
                                  : kDefaultElasticTimeoutSeconds;
      if (members + static_cast<int>(addable) >= job.spec.min_np) {
        // Once for the epoch: a post that finds the job moved on does nothing.
        slow_.Post(
            [this, id = job.id, epoch = job.epoch] { Reshape(id, epoch, "workers came free"); });
      } else if (now - *below_since >= absl::Seconds(timeout)) {
        {
          absl::MutexLock lock(&mu_);
          below_min_since_.erase(job.id);
        }
        FinishLater(job.id, JobState::kFailed,
                    absl::StrCat("elastic job had ", members, members == 1 ? " rank" : " ranks",
                                 " for ", timeout, " s (--elastic-timeout), fewer than min_np ",
                                 job.spec.min_np, " (--min-np)"));
      }
      continue;
    }
    if (notice_due) {
      slow_.Post([this, id = job.id, epoch = job.epoch] {
        Reshape(id, epoch, "workers came free and the ranks did not reset within 30 s");
      });
      continue;
    }
    if (notice_out || addable == 0 || job.state != JobState::kRunning ||
        static_cast<int>(job.ranks.size()) >= job.spec.max_np) {
      continue;
    }
    // Horovod's HostsUpdatedInterrupt: the ranks learn of it at their next commit and reset into
    // the epoch that adds the workers (or in 30 s, whatever they are doing).
    {
      absl::MutexLock lock(&mu_);
      grow_notices_[job.id] = GrowNotice{job.epoch, now + kGrowGrace};
      for (const RankInfo& r : job.ranks) {
        if (WorkerChannel* channel = ChannelOf(r.worker_id)) {
          channel->SendHostsUpdated(job.id, job.epoch);
        }
      }
    }
    jobs_
        .AddEvent(job.id, absl::StrCat(addable, addable == 1 ? " worker" : " workers",
                                       " came free: the ranks reset into a bigger epoch at their "
                                       "next commit"))
        .IgnoreError();
  }
}

}  // namespace ringmaster
