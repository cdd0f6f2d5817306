// Coordinator, part 4 of 5: the rendezvous key-value store the ranks of a job epoch meet through
// (Gloo's store, NCCL's unique ids), scoped to a running job's current epoch.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/secret.h"
#include "coordinator/coordinator.h"
#include "spdlog/spdlog.h"

namespace ringmaster {

absl::Status Coordinator::CheckScope(const std::string& job_id, int64_t epoch,
                                     const std::string* token) const {
  absl::StatusOr<Job> job = jobs_.Get(job_id);
  if (!job.ok()) return job.status();
  const bool active = job->state == JobState::kStarting || job->state == JobState::kRunning;
  if (token != nullptr &&
      (job->rendezvous_token.empty() || !ConstantTimeEquals(*token, job->rendezvous_token))) {
    // Told before anything of the job's state: a caller without the token learns nothing of it.
    // A rank of an earlier epoch (its token was that epoch's) learns only that it is stale.
    if (active && epoch != job->epoch && epoch > 0 && epoch < job->epoch) {
      return absl::AbortedError(absl::StrCat("epoch ", epoch, " of job ", job_id, " is stale"));
    }
    return absl::PermissionDeniedError(absl::StrCat("the rendezvous of job ", job_id, " epoch ",
                                                    epoch,
                                                    " is open only to its ranks' workers: the call "
                                                    "did not carry the epoch's rendezvous token"));
  }
  if (!active) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, " is ", JobStateName(job->state), "; its rendezvous is closed"));
  }
  if (epoch != job->epoch) {
    return absl::AbortedError(absl::StrCat("epoch ", epoch, " of job ", job_id,
                                           " is stale; the job is at epoch ", job->epoch));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Coordinator::JobSourcePath(const std::string& job_id, int64_t epoch,
                                                       const std::string* token) const {
  if (absl::Status s = CheckScope(job_id, epoch, token); !s.ok()) return s;
  absl::StatusOr<Job> job = jobs_.Get(job_id);
  if (!job.ok()) return job.status();
  if (job->spec.source.sha256.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job_id, " has no source archive"));
  }
  return sources_.PathOf(job->spec.source.sha256);
}

absl::Status Coordinator::BeginRankOutput(const std::string& job_id, int64_t epoch, int32_t rank,
                                          const std::string& token) const {
  absl::StatusOr<Job> job = jobs_.Get(job_id);
  if (!job.ok()) return job.status();
  if (epoch != job->epoch) {
    return absl::AbortedError(absl::StrCat("epoch ", epoch, " of job ", job_id,
                                           " is stale; the job is at epoch ", job->epoch));
  }
  if (job->rendezvous_token.empty() || !ConstantTimeEquals(token, job->rendezvous_token)) {
    return absl::PermissionDeniedError(
        absl::StrCat("the output of job ", job_id, " epoch ", epoch,
                     " is accepted only from its ranks' workers: the call did not carry the "
                     "epoch's rendezvous token"));
  }
  if (rank < 0 || rank >= job->spec.np) {
    return absl::InvalidArgumentError(absl::StrCat("header.rank = ", rank, " is out of bounds [0, ",
                                                   job->spec.np - 1, "] of job ", job_id));
  }
  return artifacts_.ResetRank(job_id, rank);
}

absl::Status Coordinator::RendezvousSet(const std::string& job_id, int64_t epoch,
                                        const std::string& key, std::string value,
                                        const std::string* token) {
  if (absl::Status s = CheckScope(job_id, epoch, token); !s.ok()) return s;
  return rendezvous_.Set(RendezvousStore::Scope(job_id, epoch), key, std::move(value));
}

absl::StatusOr<std::string> Coordinator::RendezvousGet(const std::string& job_id, int64_t epoch,
                                                       const std::string& key,
                                                       const std::string* token) {
  if (absl::Status s = CheckScope(job_id, epoch, token); !s.ok()) return s;
  return rendezvous_.Get(RendezvousStore::Scope(job_id, epoch), key);
}

void Coordinator::RendezvousWait(const std::string& job_id, int64_t epoch,
                                 std::vector<std::string> keys, absl::Duration timeout,
                                 RendezvousStore::WaitCallback done, const std::string* token) {
  if (absl::Status s = CheckScope(job_id, epoch, token); !s.ok()) {
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

}  // namespace ringmaster
