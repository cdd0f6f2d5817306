// Coordinator, part 2 of 5: the workers' sessions. A session opens and closes, carries
// heartbeats, request batches (to the job's runtime, which negotiates), timeline spans and rank
// updates (a rank started or exited: the job runs, succeeds or fails). The table of contents is
// coordinator.h; jobs and scheduling are coordinator.cc.
#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/coordinator.h"
#include "spdlog/spdlog.h"

namespace ringmaster {

absl::Status Coordinator::OpenSession(const std::string& worker_id, WorkerChannel* channel,
                                      uint64_t incarnation) {
  absl::StatusOr<Worker> worker = workers_.Get(worker_id);
  if (!worker.ok()) return worker.status();
  if (absl::Status s = workers_.CheckIncarnation(worker_id, incarnation); !s.ok()) return s;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = workers_.SetConnected(worker_id, true); !s.ok()) return s;
    if (WorkerChannel* old = ChannelOf(worker_id); old != nullptr && old != channel) {
      old->Close(absl::AbortedError("superseded by a newer session of the same worker"));
    }
    channels_[worker_id] = channel;
    // A worker that reconnects while serving a job whose rank has not started gets its assignment
    // again (it may have been lost with the session). One whose rank started has it; one whose
    // rank exited must not start it again.
    if (!worker->job_id.empty()) {
      if (auto it = runtimes_.find(worker->job_id); it != runtimes_.end()) {
        if (absl::StatusOr<Job> job = jobs_.Get(worker->job_id);
            job.ok() && worker->rank >= 0 && worker->rank < static_cast<int>(job->ranks.size()) &&
            job->ranks[worker->rank].state == RankState::kAssigned) {
          channel->SendAssignment(*job, worker->rank);
        }
      }
    }
  }
  spdlog::info("worker {} ({}) connected", worker_id, worker->host);
  Schedule();
  return absl::OkStatus();
}

void Coordinator::ResumeRanks(const std::string& worker_id, WorkerChannel* channel,
                              const std::vector<RankResume>& resume) {
  for (const RankResume& r : resume) Resume(worker_id, channel, r);
  // A worker that reattaches to a restoring job without resuming its rank holds nothing of it.
  absl::StatusOr<Worker> w = workers_.Get(worker_id);
  if (!w.ok() || w->job_id.empty()) return;
  const bool resumed = std::any_of(resume.begin(), resume.end(),
                                   [&](const RankResume& r) { return r.job_id == w->job_id; });
  std::shared_ptr<JobRuntime> runtime = RuntimeOf(w->job_id);
  if (!resumed && runtime != nullptr && runtime->restoring()) {
    GatherRank(worker_id, *runtime, w->rank, nullptr);
  }
}

void Coordinator::Resume(const std::string& worker_id, WorkerChannel* channel,
                         const RankResume& r) {
  absl::StatusOr<std::shared_ptr<JobRuntime>> runtime =
      RuntimeFor(worker_id, r.job_id, r.epoch, r.rank);
  if (!runtime.ok()) {
    // Not (or no longer) this worker's: it re-sends what it has, which is refused (and the rank
    // stopped) like any batch of a job it does not serve.
    channel->SendResumed(r.job_id, r.epoch, r.rank, 0);
    return;
  }
  // Resumed on its own session: its lists come on it for the rest of the epoch (a relay's
  // session that broke loses what it carried; its ranks resume like this).
  (*runtime)->RouteDirect(r.rank);
  if ((*runtime)->restoring()) {  // the coordinator restarted: what the rank holds restores it
    GatherRank(worker_id, **runtime, r.rank, &r);
    return;
  }
  // Under the runtime's lock, like a flush: every list goes out in cycle order. A flush may still
  // slip a newer list in before the re-sent ones on this channel; the worker holds it until the
  // gap is filled.
  absl::Status resent = (*runtime)->Resend(r.rank, r.last_response_seq,
                                           [&](const std::shared_ptr<CycleBroadcast>& cycle) {
                                             absl::MutexLock lock(&mu_);
                                             if (ChannelOf(worker_id) == channel)
                                               channel->SendResponses(cycle, r.rank);
                                           });
  if (!resent.ok()) {
    FinishLater(r.job_id, JobState::kFailed, std::string(resent.message()));
    return;
  }
  // Read before mu_: the runtime's lock comes before the coordinator's (a flush holds the runtime's
  // while it takes mu_ to deliver), never after it.
  const uint64_t last_request_seq = (*runtime)->LastRequestSeq(r.rank);
  absl::MutexLock lock(&mu_);
  if (ChannelOf(worker_id) == channel) {
    channel->SendResumed(r.job_id, r.epoch, r.rank, last_request_seq);
  }
  spdlog::info("worker {} resumed rank {} of job {} from response list {}", worker_id, r.rank,
               r.job_id, r.last_response_seq);
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
        // An elastic job's worker that is no longer among its ranks stops its rank altogether.
        if (absl::StatusOr<Worker> w = workers_.Get(worker_id);
            !w.ok() || w->state != WorkerState::kBusy || w->job_id != job_id) {
          return absl::FailedPreconditionError(absl::StrCat("worker ", worker_id,
                                                            " no longer serves job ", job_id,
                                                            " (at epoch ", runtime->epoch(), ")"));
        }
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
  // An elastic job waiting for workers (below min_np) has no runtime: its ranks' epoch ended, but
  // their processes wait for the next one.
  if (job->spec.elastic() && !IsTerminal(job->state)) {
    if (absl::StatusOr<Worker> w = workers_.Get(worker_id);
        w.ok() && w->state == WorkerState::kBusy && w->job_id == job_id) {
      return absl::AbortedError(
          absl::StrCat("epoch ", epoch, " of job ", job_id, " ended; the job waits for workers"));
    }
  }
  return absl::FailedPreconditionError(absl::StrCat("worker ", worker_id, " is not assigned rank ",
                                                    rank, " of job ", job_id, ", which is ",
                                                    JobStateName(job->state)));
}

absl::Status Coordinator::SubmitRequests(const std::string& worker_id, RequestBatch batch) {
  auto runtime = RuntimeFor(worker_id, batch.job_id, batch.epoch, batch.rank);
  if (!runtime.ok()) return runtime.status();
  // The rank's own session: its lists come back on it from now on.
  if ((*runtime)->relayed()) (*runtime)->RouteDirect(batch.rank);
  const absl::Time now = clock_->Now();
  if (!Submit(**runtime, worker_id, std::move(batch), now)) return absl::OkStatus();
  Flush(**runtime, now);
  // A cycle that is not due yet (some ranks have not submitted) must be flushed at its deadline.
  if (const absl::Time next = (*runtime)->NextDeadline(); next != absl::InfiniteFuture()) {
    WakeTicker(next);
  }
  return absl::OkStatus();
}

bool Coordinator::Submit(JobRuntime& runtime, const std::string& worker_id, RequestBatch batch,
                         absl::Time now) {
  // A batch re-sent after a reconnect that the runtime has already is dropped; nothing to flush.
  const uint64_t generation = batch.cache_generation, acked = batch.ack_responses;
  const int32_t rank = batch.rank;
  if (runtime.Submit(batch.rank, std::move(batch.requests), batch.cached_ids, now, batch.seq,
                     batch.ack_responses, batch.cache_generation, batch.used_ids)) {
    return true;
  }
  ResendIfStale(runtime, worker_id, rank, acked, generation);
  return false;
}

bool Coordinator::EndedRankExited(const std::string& worker_id, const RankUpdate& update) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_ranks_.contains(update.job_id)) return false;
  }
  // Only the worker that served the rank speaks for it.
  absl::StatusOr<Job> job = jobs_.Get(update.job_id);
  if (!job.ok() || update.rank < 0 || update.rank >= static_cast<int32_t>(job->ranks.size()) ||
      job->ranks[update.rank].worker_id != worker_id) {
    return false;
  }
  bool last = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = stopping_ranks_.find(update.job_id);
    if (it == stopping_ranks_.end()) return true;  // its log has ended already
    it->second.erase(update.rank);
    last = it->second.empty();
    if (last) stopping_ranks_.erase(it);
  }
  // Its output came before this report: once every stopped rank's has, the log is whole.
  if (last) logs_.End(update.job_id);
  return true;
}

void Coordinator::ResendIfStale(JobRuntime& runtime, const std::string& worker_id, int32_t rank,
                                uint64_t acked, uint64_t generation) {
  // Encoded in an old cache generation after a restore: the rank has not seen the new
  // generation's first list (its rank started late, or its worker dropped lists meant for a job
  // it had not started yet). It gets the lists after the last one it acknowledged again, on its
  // own session; it drops those it has.
  if (generation != runtime.cache_generation() && !runtime.restoring()) {
    runtime
        .Resend(rank, acked,
                [&](const std::shared_ptr<CycleBroadcast>& cycle) {
                  absl::MutexLock lock(&mu_);
                  if (WorkerChannel* channel = ChannelOf(worker_id)) {
                    channel->SendResponses(cycle, rank);
                  }
                })
        .IgnoreError();
  }
}

absl::Status Coordinator::SubmitRelayed(const std::string& relay_id,
                                        std::vector<RequestBatch> batches,
                                        absl::Span<const uint32_t> shared_cached_ids) {
  absl::StatusOr<Worker> relay = workers_.Get(relay_id);
  if (!relay.ok()) return relay.status();
  absl::Status first_error;
  // A relay carries the ranks of the one job it serves a rank of.
  const std::shared_ptr<JobRuntime> runtime =
      relay->job_id.empty() ? nullptr : RuntimeOf(relay->job_id);
  // The relay's rank in the runtime's epoch (not the registry's: an elastic reset renumbers the
  // workers before the old epoch's runtime goes), -1 when it holds none.
  const int32_t relay_rank = runtime == nullptr ? -1 : runtime->RankOfWorker(relay_id);
  std::vector<RequestBatch> carried;
  std::vector<std::string> worker_ids;  // of `carried`, by index
  for (RequestBatch& batch : batches) {
    absl::Status why;
    if (runtime == nullptr || runtime->epoch() != batch.epoch || relay->job_id != batch.job_id) {
      why = absl::FailedPreconditionError(absl::StrCat("relay ", relay_id, " does not serve epoch ",
                                                       batch.epoch, " of job ", batch.job_id));
    } else if (batch.rank < 0 || batch.rank >= static_cast<int32_t>(runtime->ranks().size())) {
      why = absl::InvalidArgumentError(absl::StrCat("relayed.batches.rank ", batch.rank,
                                                    " is not a rank of job ", batch.job_id));
    } else if (const RankInfo& info = runtime->ranks()[batch.rank];
               relay_rank < 0 || runtime->RelayOf(batch.rank) != relay_rank ||
               info.worker_identity != relay->identity) {
      // Only the rank the job's plan names relays a rank (its host's lowest, or its group of
      // hosts' with negotiation_relay_hosts), and only for a worker of its own identity.
      why = absl::PermissionDeniedError(
          absl::StrCat("relay ", relay_id, " (rank ", relay_rank, ", host ", relay->host,
                       ") may not relay rank ", batch.rank, " of job ", batch.job_id,
                       ", whose worker is on host ", info.host,
                       info.worker_identity != relay->identity
                           ? " under another identity"
                           : absl::StrCat(" and relayed by rank ", runtime->RelayOf(batch.rank))));
    } else {
      worker_ids.push_back(info.worker_id);
      carried.push_back(std::move(batch));
      continue;
    }
    if (first_error.ok()) first_error = why;
  }
  if (carried.empty()) return first_error;
  const absl::Time now = clock_->Now();
  const std::vector<char> taken = runtime->SubmitRelayed(carried, shared_cached_ids, now);
  for (size_t i = 0; i < carried.size(); ++i) {
    if (taken[i]) {
      runtime->RouteVia(carried[i].rank, relay_id);
    } else {
      ResendIfStale(*runtime, worker_ids[i], carried[i].rank, carried[i].ack_responses,
                    carried[i].cache_generation);
    }
  }
  Flush(*runtime, now);
  if (const absl::Time next = runtime->NextDeadline(); next != absl::InfiniteFuture()) {
    WakeTicker(next);
  }
  return first_error;
}

void Coordinator::Flush(JobRuntime& runtime, absl::Time now) {
  bool negotiated = false;
  runtime.Flush(now, [this, &runtime, &negotiated](const std::shared_ptr<CycleBroadcast>& cycle) {
    negotiated = !cycle->output.responses.empty();
    absl::MutexLock lock(&mu_);
    if (!runtime.relayed()) {
      for (const RankInfo& r : runtime.ranks()) {
        if (WorkerChannel* channel = ChannelOf(r.worker_id)) channel->SendResponses(cycle, r.rank);
      }
      return;
    }
    // Ranks whose batches came through a relay get the list through it, one message per relay.
    std::vector<std::pair<int32_t, std::string>> relayed;
    runtime.ForEachRelayed(
        [&](int32_t rank, const std::string& relay) { relayed.emplace_back(rank, relay); });
    std::vector<char> via_relay(runtime.ranks().size(), 0);
    absl::flat_hash_map<std::string, std::vector<int>> groups;
    for (auto& [rank, relay] : relayed) {
      if (ChannelOf(relay) == nullptr) continue;  // its session is gone: direct until it resumes
      groups[relay].push_back(rank);
      via_relay[rank] = 1;
    }
    for (const RankInfo& r : runtime.ranks()) {
      if (via_relay[r.rank]) continue;
      if (WorkerChannel* channel = ChannelOf(r.worker_id)) channel->SendResponses(cycle, r.rank);
    }
    for (const auto& [relay, ranks] : groups) ChannelOf(relay)->SendRelayedResponses(cycle, ranks);
  });
  if (negotiated) NoteFirstCycleAfterRestore(runtime);  // a no-op but once after a restore
  // A collective failed because a rank it needs has ended: the job cannot go on as it was.
  if (std::string failure = runtime.TakeEndedRankFailure(); !failure.empty()) {
    spdlog::warn("job {}: {}", runtime.job_id(), failure);
    jobs_.AddEvent(runtime.job_id(), failure).IgnoreError();
    absl::MutexLock lock(&mu_);
    pending_failures_.try_emplace(
        runtime.job_id(), PendingFailure{std::move(failure), "", clock_->Now() + failure_settle_});
  }
}

absl::Status Coordinator::RecordTimeline(const std::string& worker_id, const std::string& job_id,
                                         int64_t epoch, int32_t rank,
                                         std::vector<ExecutionSpan> spans, int64_t skew_us) {
  auto runtime = RuntimeFor(worker_id, job_id, epoch, rank);
  if (!runtime.ok()) return runtime.status();
  (*runtime)->RecordExecution(rank, std::move(spans), skew_us);
  return absl::OkStatus();
}

absl::Status Coordinator::RecordRankExecution(const std::string& worker_id,
                                              const std::string& job_id, int64_t epoch,
                                              int32_t rank,
                                              const ExecutionTracker::Sample& sample) {
  auto runtime = RuntimeFor(worker_id, job_id, epoch, rank);
  if (!runtime.ok()) return runtime.status();
  return (*runtime)->RecordRankExecution(rank, sample);
}

absl::Status Coordinator::UpdateRank(const std::string& worker_id, const RankUpdate& update) {
  if (update.state == RankState::kExited && EndedRankExited(worker_id, update)) {
    return absl::OkStatus();
  }
  auto runtime = RuntimeFor(worker_id, update.job_id, update.epoch, update.rank);
  if (!runtime.ok()) return runtime.status();
  if (update.message.size() > 4096) {
    return absl::InvalidArgumentError("rank_update.message is longer than 4096 bytes");
  }
  // Elastic jobs: a rank's data plane failing is a reset (its process goes on into the next
  // epoch), and a process failing leaves the job its other ranks.
  if (absl::StatusOr<Job> known = jobs_.Get(update.job_id);
      known.ok() && known->spec.elastic() && known->epoch != update.epoch) {
    return absl::AbortedError(
        absl::StrCat("epoch ", update.epoch, " of job ", update.job_id, " has ended"));
  }
  if (absl::StatusOr<Job> known = jobs_.Get(update.job_id);
      known.ok() && known->spec.elastic() && update.state == RankState::kExited && update.failed) {
    const RankInfo& r = known->ranks[update.rank];
    NoteMembershipChange(update.job_id, update.epoch,
                         absl::StrCat(Placement(r), " failed: ", update.message));
    return absl::OkStatus();
  }
  // A rank exits once: its first report stands (a rank whose data plane failed may see its
  // process exit, even with 0, afterwards). A report repeated after a reconnect (the worker
  // re-sends its last ones) changes nothing either.
  if (absl::StatusOr<Job> known = jobs_.Get(update.job_id);
      known.ok() && update.rank >= 0 && update.rank < static_cast<int>(known->ranks.size())) {
    const RankState now = known->ranks[update.rank].state;
    if (now == RankState::kExited ||
        (update.state == RankState::kStarted && now == RankState::kStarted)) {
      return absl::OkStatus();
    }
  }
  absl::StatusOr<Job> job =
      jobs_.UpdateRank(update.job_id, update.rank, update.state, update.exit_code);
  if (!job.ok()) return job.status();
  const RankInfo& rank = job->ranks[update.rank];
  // A restoring job does not wait for a rank that exited.
  if (update.state == RankState::kExited) TryEndRestore(update.job_id);
  // Whether this rank's end made the job's pending failure (a peer's collective that can never
  // complete): its own failure, if it has one, is the cause and takes that failure's place.
  bool end_made_failure = false;
  if (update.state == RankState::kExited && !job->spec.elastic()) {
    bool had_failure;
    {
      absl::MutexLock lock(&mu_);
      had_failure = pending_failures_.contains(update.job_id);
    }
    // Whatever its status: every collective that needs the rank now fails on the ranks waiting
    // in it (Horovod's shutdown), instead of waiting for ever.
    std::string ended =
        update.failed
            ? absl::StrCat(Placement(rank), " failed: ", update.message)
            : absl::StrCat(Placement(rank), " exited with status ", update.exit_code,
                           update.message.empty() ? "" : absl::StrCat(" (", update.message, ")"));
    const absl::Time now = clock_->Now();
    (*runtime)->RankEnded(update.rank, std::move(ended), now);
    Flush(**runtime, now);
    if (!had_failure) {
      absl::MutexLock lock(&mu_);
      end_made_failure = pending_failures_.contains(update.job_id);
    }
    if (const absl::Time next = (*runtime)->NextDeadline(); next != absl::InfiniteFuture()) {
      WakeTicker(next);
    }
  }
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
    if (job->spec.elastic()) {
      NoteMembershipChange(update.job_id, update.epoch, std::move(reason));
      return absl::OkStatus();
    }
    const std::string stopped_already = update.failed ? "" : worker_id;
    bool restoring;
    {
      absl::MutexLock lock(&mu_);
      restoring = resume_deadlines_.contains(update.job_id);
    }
    if (std::string cause = restoring ? "" : DisconnectedWorkerOf(*job, worker_id);
        !cause.empty()) {
      FinishLater(update.job_id, JobState::kFailed, absl::StrCat(cause, "; then ", reason),
                  stopped_already);
      return absl::OkStatus();
    }
    absl::MutexLock lock(&mu_);
    if (runtimes_.contains(update.job_id)) {
      // The first failure stands, but for the symptom of this very exit.
      PendingFailure failure{std::move(reason), stopped_already, clock_->Now() + failure_settle_};
      if (auto [it, added] = pending_failures_.try_emplace(update.job_id, failure);
          !added && end_made_failure) {
        it->second = std::move(failure);
      }
    }
    return absl::OkStatus();
  }
  const bool all_done = std::all_of(job->ranks.begin(), job->ranks.end(), [](const RankInfo& r) {
    return r.state == RankState::kExited && r.exit_code == 0;
  });
  if (all_done) {
    {
      absl::MutexLock lock(&mu_);
      // A collective failed because a rank had ended: the job fails with that, once settled, even
      // if the ranks that saw the error exited 0.
      if (pending_failures_.contains(update.job_id)) return absl::OkStatus();
    }
    FinishLater(update.job_id, JobState::kSucceeded,
                absl::StrCat("all ", job->ranks.size(), " ranks exited 0"));
  }
  return absl::OkStatus();
}

}  // namespace ringmaster
