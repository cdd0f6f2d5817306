// Coordinator, part 3 of 5: what a job leaves behind and users read back: its ranks' output (the
// log store, followed live) and its artifacts (the timeline, the autotune log).
#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "coordinator/coordinator.h"
#include "spdlog/spdlog.h"

namespace ringmaster {

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

absl::Status Coordinator::AppendOutput(const std::string& worker_id, const std::string& job_id,
                                       int64_t epoch, int32_t rank, OutputStream stream,
                                       std::string data, uint64_t seq) {
  const auto runtime = RuntimeFor(worker_id, job_id, epoch, rank);
  if (!runtime.ok()) {
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
  // Notices while the job runs (its events, and their record, end with it).
  if (runtime.ok()) NoteRankNotices(job_id, rank, data);
  // The job's log may end between the check above and here; the store then refuses the chunk, so a
  // follower that saw the end has seen every chunk stored.
  return logs_.Append(job_id, rank, stream, std::move(data), seq);
}

void Coordinator::NoteRankNotices(const std::string& job_id, int32_t rank, absl::string_view data) {
  if (data.find(kRankNoticePrefix) == absl::string_view::npos) return;  // the usual case
  std::vector<std::string> events;
  for (absl::string_view line : absl::StrSplit(data, '\n')) {
    if (!absl::ConsumePrefix(&line, kRankNoticePrefix)) continue;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    std::string text(line.substr(0, kMaxRankNoticeBytes));
    if (line.size() > kMaxRankNoticeBytes) absl::StrAppend(&text, "...");
    std::string event = absl::StrCat("rank ", rank, ": ", text);
    absl::MutexLock lock(&mu_);
    absl::flat_hash_set<std::string>& seen = rank_notices_[job_id];
    // Each once (a chunk sent again after a reconnect), and a bounded number per job.
    if (static_cast<int>(seen.size()) >= kMaxRankNotices || !seen.insert(event).second) continue;
    events.push_back(std::move(event));
  }
  for (std::string& event : events) jobs_.AddEvent(job_id, std::move(event)).IgnoreError();
}

absl::Status Coordinator::CheckLogQuery(const std::string& job_id, int32_t rank) const {
  absl::StatusOr<Job> job = jobs_.Get(job_id);
  if (!job.ok()) return job.status();
  // An elastic job's ranks of earlier epochs (up to max_np) have logs too.
  const int32_t ranks = std::max(job->spec.np, job->spec.max_np);
  if (rank != LogStore::kAllRanks && (rank < 0 || rank >= ranks)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank = ", rank, " is out of bounds [0, ", ranks - 1, "] of job ", job_id));
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

}  // namespace ringmaster
