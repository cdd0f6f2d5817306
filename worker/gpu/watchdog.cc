#include "worker/gpu/watchdog.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace ringmaster {

Watchdog::Watchdog(WatchedCommunicator* communicator, std::string where, absl::Duration op_timeout,
                   std::function<void(const absl::Status&)> on_fail)
    : communicator_(communicator),
      where_(std::move(where)),
      op_timeout_(op_timeout),
      on_fail_(std::move(on_fail)) {}

absl::Status Watchdog::OpStarted(const std::string& what, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (state_ == State::kAborted) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the NCCL communicator of ", where_, " was aborted earlier: ", failure_.message()));
  }
  op_ = what;
  op_started_ = now;
  return absl::OkStatus();
}

void Watchdog::OpFinished() {
  absl::MutexLock lock(&mu_);
  op_.clear();
}

bool Watchdog::Fail(absl::Status status, bool report) {
  {
    absl::MutexLock comm_lock(&comm_mu_);
    {
      absl::MutexLock lock(&mu_);
      if (state_ == State::kAborted) return false;
      state_ = State::kAborted;
      failure_ = status;
    }
    communicator_->Abort();
  }
  if (report && on_fail_) on_fail_(status);
  return true;
}

std::optional<absl::Status> Watchdog::Check(absl::Time now) {
  absl::Status error;
  {
    absl::MutexLock comm_lock(&comm_mu_);
    {
      absl::MutexLock lock(&mu_);
      if (state_ == State::kAborted) return std::nullopt;
    }
    error = communicator_->AsyncError();
  }
  if (!error.ok()) {
    absl::Status status(error.code(),
                        absl::StrCat("NCCL error on ", where_, ": ", error.message()));
    if (Fail(status, /*report=*/true)) return status;
    return std::nullopt;
  }
  std::string op;
  absl::Time started;
  {
    absl::MutexLock lock(&mu_);
    op = op_;
    started = op_started_;
  }
  if (!op.empty() && now - started > op_timeout_) {
    absl::Status status = absl::DeadlineExceededError(absl::StrCat(
        "NCCL ", op, " on ", where_, " did not complete in ", absl::FormatDuration(op_timeout_),
        " (a peer is stuck or gone); the communicator was aborted"));
    if (Fail(status, /*report=*/true)) return status;
  }
  return std::nullopt;
}

void Watchdog::PeerLost(const std::string& why) {
  Fail(absl::UnavailableError(absl::StrCat("NCCL communicator of ", where_, " aborted: ", why)),
       /*report=*/false);
}

bool Watchdog::WithCommunicator(const std::function<void()>& use) {
  absl::MutexLock comm_lock(&comm_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (state_ == State::kAborted) return false;
  }
  use();
  return true;
}

Watchdog::State Watchdog::state() const {
  absl::MutexLock lock(&mu_);
  return state_;
}

absl::Status Watchdog::failure() const {
  absl::MutexLock lock(&mu_);
  return failure_;
}

}  // namespace ringmaster
