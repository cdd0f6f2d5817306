#include "worker/local/rank_attachment.h"

#include "absl/strings/str_cat.h"

namespace ringmaster {

bool RankAttachment::OtherAttached(int pid) const {
  return connections_ > 0 && (pid_ != pid || pid == -1);
}

absl::Status RankAttachment::Admit(int pid, const std::string& who, absl::Duration settle,
                                   absl::FunctionRef<absl::Status()> welcome) {
  absl::MutexLock lock(&mu_);
  if (closed_) return absl::UnavailableError("no job is assigned to this worker yet");
  if (OtherAttached(pid)) {
    auto gone = [this]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return connections_ == 0 || closed_; };
    mu_.AwaitWithTimeout(absl::Condition(&gone), settle);
  }
  if (closed_) return absl::UnavailableError("no job is assigned to this worker yet");
  if (OtherAttached(pid)) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, " already has a training process attached",
                     pid_ > 0 ? absl::StrCat(" (pid ", pid_, ")") : "",
                     ": one process per rank (a process started by the training process, such as a "
                     "DataLoader worker, must not call init())"));
  }
  if (absl::Status s = welcome(); !s.ok()) return s;
  pid_ = pid;
  ++connections_;
  return absl::OkStatus();
}

bool RankAttachment::Leave() {
  absl::MutexLock lock(&mu_);
  if (connections_ == 0 || --connections_ > 0) return false;
  pid_ = 0;
  return true;
}

void RankAttachment::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

int RankAttachment::pid() const {
  absl::MutexLock lock(&mu_);
  return pid_;
}

int RankAttachment::connections() const {
  absl::MutexLock lock(&mu_);
  return connections_;
}

}  // namespace ringmaster
