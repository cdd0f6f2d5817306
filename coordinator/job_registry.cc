#include "coordinator/job_registry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/secret.h"
#include "spdlog/spdlog.h"

namespace ringmaster {
namespace {

bool Allowed(JobState from, JobState to) {
  switch (to) {
    case JobState::kStarting:
      return from == JobState::kPending;
    case JobState::kRunning:
      return from == JobState::kStarting;
    case JobState::kSucceeded:
      return from == JobState::kRunning || from == JobState::kStarting;
    case JobState::kFailed:
    case JobState::kCancelled:
      return !IsTerminal(from);
    case JobState::kPending:
      return false;
  }
  return false;
}

}  // namespace

JobRegistry::JobRegistry(std::unique_ptr<JobStore> store, Clock* clock, int64_t max_active)
    : JobRegistry(std::move(store), clock, Limits{.max_active = max_active}) {}

JobRegistry::JobRegistry(std::unique_ptr<JobStore> store, Clock* clock, Limits limits)
    : clock_(clock), store_(std::move(store)), limits_(limits) {
  // A durable store may hold jobs of an earlier run: ids go on after the highest one. Pending jobs
  // wait to be placed as before; the coordinator resumes those that were starting or running.
  absl::MutexLock lock(&mu_);
  for (const Job& job : store_->List()) {
    int64_t number = 0;
    if (absl::StartsWith(job.id, "job-") && absl::SimpleAtoi(job.id.substr(4), &number)) {
      next_job_ = std::max(next_job_, number + 1);
    }
    if (!IsTerminal(job.state)) SetActiveLocked(job, true);
    RememberRequestLocked(job);
  }
}

absl::StatusOr<Job> JobRegistry::Register(JobSpec spec, std::string owner) {
  FillElasticDefaults(spec);
  if (absl::Status s = ValidateJobSpec(spec); !s.ok()) return s;
  if (owner.size() > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("owner must be at most 256 bytes; got ", owner.size()));
  }
  std::vector<std::shared_ptr<Watcher>> none;
  Job job;
  {
    absl::MutexLock lock(&mu_);
    if (!spec.request_id.empty()) {
      // A retry of a registration that went through: the same job.
      if (auto it = by_request_.find(absl::StrCat(owner, "\x1f", spec.request_id));
          it != by_request_.end()) {
        if (absl::StatusOr<Job> earlier = store_->Get(it->second); earlier.ok()) return earlier;
      }
    }
    if (static_cast<int64_t>(active_.size()) >= limits_.max_active) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the coordinator holds ", active_.size(),
          " jobs that have not ended, the most it takes (--max-active-jobs): wait for some to end, "
          "or cancel some"));
    }
    const std::string who =
        owner.empty() ? "the anonymous operator" : absl::StrCat("user '", owner, "'");
    if (limits_.max_active_per_user > 0) {
      auto held = active_by_owner_.find(owner);
      if (held != active_by_owner_.end() && held->second >= limits_.max_active_per_user) {
        return absl::ResourceExhaustedError(absl::StrCat(
            who, " holds ", held->second,
            " jobs that have not ended, the most one user may (--max-active-jobs-per-user): "
            "wait for some to end, or cancel some"));
      }
    }
    if (limits_.max_registrations_per_minute > 0) {
      const absl::Time now = clock_->Now();
      // Owners with no registration in the last minute are forgotten: the map stays small.
      for (auto it = registrations_.begin(); it != registrations_.end();) {
        std::deque<absl::Time>& times = it->second;
        while (!times.empty() && times.front() <= now - absl::Minutes(1)) times.pop_front();
        if (times.empty()) {
          registrations_.erase(it++);
        } else {
          ++it;
        }
      }
      std::deque<absl::Time>& times = registrations_[owner];
      if (static_cast<int64_t>(times.size()) >= limits_.max_registrations_per_minute) {
        return absl::ResourceExhaustedError(absl::StrCat(
            who, " registered ", times.size(),
            " jobs in the last minute, the most one user may (--max-registrations-per-minute): "
            "retry in ",
            absl::FormatDuration(
                absl::Ceil(times.front() + absl::Minutes(1) - now, absl::Seconds(1)))));
      }
      times.push_back(now);
    }
    job.id = absl::StrFormat("job-%06d", next_job_++);
    job.spec = std::move(spec);
    job.owner = std::move(owner);
    job.state = JobState::kPending;
    job.create_time = clock_->Now();
    none = CommitLocked(job, absl::StrCat("registered: ", job.spec.np, " ranks"));
    // Acknowledged only once stored (its id is not used again either way).
    if (!last_put_.ok()) {
      SetActiveLocked(job, false);
      return last_put_;
    }
    RememberRequestLocked(job);
  }
  return job;
}

void JobRegistry::RememberRequestLocked(const Job& job) {
  if (job.spec.request_id.empty()) return;
  std::string key = absl::StrCat(job.owner, "\x1f", job.spec.request_id);
  if (!by_request_.insert_or_assign(key, job.id).second) return;
  request_order_.push_back(std::move(key));
  while (request_order_.size() > kRememberedRequests) {
    by_request_.erase(request_order_.front());
    request_order_.pop_front();
  }
}

void JobRegistry::SetActiveLocked(const Job& job, bool active) {
  auto it = active_.find(job.id);
  if (active == (it != active_.end())) return;
  if (active) {
    active_.emplace(job.id, job.owner);
    ++active_by_owner_[job.owner];
    return;
  }
  auto held = active_by_owner_.find(it->second);
  if (held != active_by_owner_.end() && --held->second <= 0) active_by_owner_.erase(held);
  active_.erase(it);
}

absl::StatusOr<Job> JobRegistry::LoadLocked(const std::string& id) const {
  if (id.empty() || id.size() > 64) {
    return absl::InvalidArgumentError(absl::StrCat("job_id must be 1..64 bytes; got ", id.size()));
  }
  return store_->Get(id);
}

std::vector<std::string> JobRegistry::Evict(absl::Time now, absl::Duration retention,
                                            int64_t max_ended) {
  // The store is read whole without the registry's lock (it is thread-safe itself: a durable one
  // may be slow, and calls must not wait on the scan); each removal re-reads its job under the lock
  // and goes ahead only if it has still ended.
  std::vector<Job> jobs = store_->List();  // oldest first
  std::vector<std::string> evicted;
  if (jobs.empty()) return evicted;
  int64_t ended = 0;
  for (const Job& job : jobs) ended += IsTerminal(job.state) ? 1 : 0;
  for (size_t i = 0; i + 1 < jobs.size(); ++i) {  // never the newest
    const Job& job = jobs[i];
    if (!IsTerminal(job.state)) continue;
    if (job.update_time > now - retention && ended <= max_ended) continue;
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Job> current = store_->Get(job.id);
    if (!current.ok() || !IsTerminal(current->state)) continue;
    if (absl::Status s = store_->Delete(job.id); !s.ok()) {
      spdlog::warn("job {} not evicted: {}", job.id, s.ToString());
      continue;
    }
    --ended;
    watchers_.erase(job.id);
    evicted.push_back(job.id);
  }
  return evicted;
}

absl::StatusOr<Job> JobRegistry::Get(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  return LoadLocked(id);
}

std::vector<Job> JobRegistry::List(const std::vector<JobState>& states) const {
  std::vector<Job> all;
  {
    absl::MutexLock lock(&mu_);
    all = store_->List();
  }
  std::vector<Job> out;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (states.empty() || std::find(states.begin(), states.end(), it->state) != states.end()) {
      out.push_back(std::move(*it));
    }
  }
  return out;
}

std::vector<std::shared_ptr<JobRegistry::Watcher>> JobRegistry::CommitLocked(Job& job,
                                                                             std::string message) {
  job.update_time = clock_->Now();
  job.events.push_back(JobEvent{job.update_time, job.state, std::move(message)});
  if (IsTerminal(job.state)) {
    SetActiveLocked(job, false);
    for (auto& [name, value] : job.spec.env) value.clear();  // no rank needs them any more
  } else {
    SetActiveLocked(job, true);
  }
  // The in-memory store cannot fail; a durable one's error is logged here and refuses a
  // registration (Register checks last_put_).
  last_put_ = store_->Put(job);
  if (!last_put_.ok()) spdlog::error("job {}: {}", job.id, last_put_.ToString());
  std::vector<std::shared_ptr<Watcher>> out;
  if (auto it = watchers_.find(job.id); it != watchers_.end()) {
    for (auto& [watch_id, w] : it->second) out.push_back(w);
  }
  return out;
}

void JobRegistry::Notify(const std::vector<std::shared_ptr<Watcher>>& watchers, const Job& job) {
  for (const auto& w : watchers) (*w)(job, job.events.back());
}

absl::StatusOr<Job> JobRegistry::Transition(const std::string& id, JobState to, std::string message,
                                            std::optional<JobThroughput> final_throughput) {
  std::vector<std::shared_ptr<Watcher>> watchers;
  Job job;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Job> loaded = LoadLocked(id);
    if (!loaded.ok()) return loaded.status();
    job = *std::move(loaded);
    if (!Allowed(job.state, to)) {
      return absl::FailedPreconditionError(absl::StrCat("job ", id, " is ", JobStateName(job.state),
                                                        "; it cannot become ", JobStateName(to)));
    }
    job.state = to;
    if (IsTerminal(to)) {
      job.reason = message;
      for (RankInfo& r : job.ranks) {
        if (r.state != RankState::kExited) r.state = RankState::kStopped;
      }
      if (final_throughput.has_value()) job.throughput = std::move(final_throughput);
    }
    watchers = CommitLocked(job, std::move(message));
    // Notify under notify_mu_ (taken before mu_ is released) so events reach watchers in order.
    notify_mu_.Lock();
  }
  Notify(watchers, job);
  notify_mu_.Unlock();
  return job;
}

absl::StatusOr<Job> JobRegistry::Start(const std::string& id, std::vector<RankInfo> ranks,
                                       std::string message) {
  return Place(id, std::move(ranks), std::move(message), /*next_epoch=*/false);
}

absl::StatusOr<Job> JobRegistry::NextEpoch(const std::string& id, std::vector<RankInfo> ranks,
                                           std::string message) {
  return Place(id, std::move(ranks), std::move(message), /*next_epoch=*/true);
}

absl::StatusOr<Job> JobRegistry::Place(const std::string& id, std::vector<RankInfo> ranks,
                                       std::string message, bool next_epoch) {
  std::vector<std::shared_ptr<Watcher>> watchers;
  Job job;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Job> loaded = LoadLocked(id);
    if (!loaded.ok()) return loaded.status();
    job = *std::move(loaded);
    if (!next_epoch && !Allowed(job.state, JobState::kStarting)) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", id, " is ", JobStateName(job.state), "; it cannot start"));
    }
    if (next_epoch && (!job.spec.elastic() ||
                       (job.state != JobState::kStarting && job.state != JobState::kRunning))) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", id, " is ", JobStateName(job.state), job.spec.elastic() ? "" : " and not elastic",
          "; it cannot start a new epoch"));
    }
    if (next_epoch) {
      ++job.resets;  // the state stays STARTING or RUNNING
    } else {
      job.state = JobState::kStarting;
    }
    job.ranks = std::move(ranks);
    if (job.spec.elastic()) job.spec.np = static_cast<int32_t>(job.ranks.size());
    ++job.epoch;
    job.rendezvous_token = RandomSecret();
    watchers = CommitLocked(job, std::move(message));
    notify_mu_.Lock();
  }
  Notify(watchers, job);
  notify_mu_.Unlock();
  return job;
}

absl::StatusOr<Job> JobRegistry::UpdateRank(const std::string& id, int rank, RankState state,
                                            int exit_code) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Job> loaded = LoadLocked(id);
  if (!loaded.ok()) return loaded.status();
  Job job = *std::move(loaded);
  if (rank < 0 || rank >= static_cast<int>(job.ranks.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is out of bounds for job ", id, " of ", job.ranks.size()));
  }
  job.ranks[rank].state = state;
  job.ranks[rank].exit_code = exit_code;
  job.update_time = clock_->Now();
  if (absl::Status s = store_->Put(job); !s.ok()) spdlog::error("job {}: {}", id, s.ToString());
  return job;
}

absl::Status JobRegistry::AddEvent(const std::string& id, std::string message) {
  std::vector<std::shared_ptr<Watcher>> watchers;
  Job job;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Job> loaded = LoadLocked(id);
    if (!loaded.ok()) return loaded.status();
    job = *std::move(loaded);
    watchers = CommitLocked(job, std::move(message));
    notify_mu_.Lock();
  }
  Notify(watchers, job);
  notify_mu_.Unlock();
  return absl::OkStatus();
}

absl::StatusOr<int64_t> JobRegistry::Watch(const std::string& id, Watcher watcher) {
  absl::MutexLock lock(&mu_);
  if (absl::StatusOr<Job> job = LoadLocked(id); !job.ok()) return job.status();
  const int64_t watch_id = next_watch_++;
  watchers_[id][watch_id] = std::make_shared<Watcher>(std::move(watcher));
  return watch_id;
}

void JobRegistry::Unwatch(const std::string& id, int64_t watch_id) {
  absl::MutexLock lock(&mu_);
  auto it = watchers_.find(id);
  if (it == watchers_.end()) return;
  it->second.erase(watch_id);
  if (it->second.empty()) watchers_.erase(it);
}

}  // namespace ringmaster
