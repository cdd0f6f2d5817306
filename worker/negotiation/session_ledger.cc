#include "worker/negotiation/session_ledger.h"

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
  held_.clear();
}

void SessionLedger::FillResume(v1::RankResume* resume) const {
  absl::MutexLock lock(&mu_);
  resume->set_rank(rank_);
  resume->set_last_response_seq(applied_);
  resume->set_last_request_seq(next_seq_ - 1);
  for (const v1::ResponseList& list : retained_) *resume->add_retained() = list;
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
  ForgetRetainedThrough(list.all_have());
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
    Retain(held_.begin()->second);
    out.push_back(std::move(held_.begin()->second));
    held_.erase(held_.begin());
    ++applied_;
  }
  return out;
}

void SessionLedger::Retain(const v1::ResponseList& list) {
  v1::ResponseList& kept = retained_.emplace_back(list);
  // What every rank executes, without what this rank alone was told.
  kept.clear_resend_ids();
  kept.clear_rank_errors();
  retained_bytes_ += kept.ByteSizeLong();  // cached in the message: not measured again
  while (retained_.size() > kMaxRetained ||
         (retained_bytes_ > kMaxRetainedBytes && retained_.size() > 1)) {
    retained_bytes_ -= retained_.front().GetCachedSize();  // as Retain measured it
    retained_.pop_front();
  }
}

void SessionLedger::ForgetRetainedThrough(uint64_t seq) {
  while (!retained_.empty() && retained_.front().seq() <= seq) {
    retained_bytes_ -= retained_.front().GetCachedSize();  // as Retain measured it
    retained_.pop_front();
  }
}

size_t SessionLedger::retained() const {
  absl::MutexLock lock(&mu_);
  return retained_.size();
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
