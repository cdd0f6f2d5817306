#include "worker/session_ledger.h"

#include "spdlog/spdlog.h"

namespace ringmaster {

bool SessionLedger::Prepare(v1::WorkerMessage& m) {
  absl::MutexLock lock(&mu_);
  v1::RequestBatch* batch = m.mutable_requests();
  batch->set_seq(next_seq_++);
  batch->set_ack_responses(applied_);
  kept_.push_back(m);
  if (kept_.size() > kMaxKept) {
    spdlog::warn("rank {}: {} request batches unacknowledged; forgetting batch {}", rank_,
                 kept_.size(), kept_.front().requests().seq());
    kept_.pop_front();
  }
  return !resuming_;
}

void SessionLedger::Lost() {
  absl::MutexLock lock(&mu_);
  resuming_ = true;
}

void SessionLedger::FillResume(v1::RankResume* resume) const {
  absl::MutexLock lock(&mu_);
  resume->set_rank(rank_);
  resume->set_last_response_seq(applied_);
}

std::vector<v1::WorkerMessage> SessionLedger::Resumed(uint64_t last_request_seq) {
  absl::MutexLock lock(&mu_);
  ForgetThrough(last_request_seq);
  resuming_ = false;
  std::vector<v1::WorkerMessage> out(kept_.begin(), kept_.end());
  // Sent again with what this rank has received by now.
  for (v1::WorkerMessage& m : out) m.mutable_requests()->set_ack_responses(applied_);
  return out;
}

std::vector<v1::ResponseList> SessionLedger::Accept(v1::ResponseList list) {
  absl::MutexLock lock(&mu_);
  if (static_cast<size_t>(rank_) < static_cast<size_t>(list.request_acks_size())) {
    ForgetThrough(list.request_acks(rank_));
  }
  std::vector<v1::ResponseList> out;
  if (list.seq() == 0) {  // unnumbered: applied as it comes
    out.push_back(std::move(list));
    return out;
  }
  if (list.seq() <= applied_ || held_.contains(list.seq())) return out;  // a duplicate
  if (held_.size() >= kMaxHeld) {
    spdlog::error("rank {}: {} response lists held waiting for list {}; dropping list {}", rank_,
                  held_.size(), applied_ + 1, list.seq());
    return out;
  }
  held_.emplace(list.seq(), std::move(list));
  while (!held_.empty() && held_.begin()->first == applied_ + 1) {
    out.push_back(std::move(held_.begin()->second));
    held_.erase(held_.begin());
    ++applied_;
  }
  return out;
}

uint64_t SessionLedger::last_response_seq() const {
  absl::MutexLock lock(&mu_);
  return applied_;
}

size_t SessionLedger::kept() const {
  absl::MutexLock lock(&mu_);
  return kept_.size();
}

void SessionLedger::ForgetThrough(uint64_t seq) {
  while (!kept_.empty() && kept_.front().requests().seq() <= seq) kept_.pop_front();
}

}  // namespace ringmaster
