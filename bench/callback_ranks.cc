#include "bench/callback_ranks.h"

#include <atomic>
#include <deque>
#include <map>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/negotiation_wire.h"
#include "common/relay_plan.h"

namespace ringmaster {

class CallbackRanks::Rank
    : public grpc::ClientBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage> {
 public:
  Rank(v1::WorkerService::Stub* stub, std::string worker_id, const std::string& secret)
      : worker_id_(std::move(worker_id)) {
    stub->async()->Session(&context_, this);
    v1::WorkerMessage open;
    open.mutable_open()->set_worker_id(worker_id_);
    open.mutable_open()->set_secret(secret);
    Write(std::move(open));
    StartRead(&in_);
    StartCall();
  }

  // Queues a message; writes go one at a time.
  void Write(v1::WorkerMessage m) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(m));
    if (!writing_) {
      writing_ = true;
      StartWrite(&queue_.front());
    }
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    queue_.pop_front();
    if (ok && !queue_.empty()) {
      StartWrite(&queue_.front());
    } else {
      writing_ = false;
    }
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended; OnDone follows
    switch (in_.kind_case()) {
      case v1::CoordinatorMessage::kAssignment: {
        absl::MutexLock lock(&mu_);
        assignment_ = in_.assignment();
        assigned_.Notify();
        break;
      }
      case v1::CoordinatorMessage::kResponses:
        Apply(in_.responses());
        break;
      case v1::CoordinatorMessage::kRelayed: {
        // The relay hands the list to each of its host's ranks (the notices are not simulated:
        // the cache never evicts here).
        const v1::RelayedResponses& relayed = in_.relayed();
        for (int32_t rank : relayed.ranks()) {
          if (by_rank_ != nullptr && rank >= 0 && rank < static_cast<int>(by_rank_->size())) {
            (*by_rank_)[rank]->Apply(relayed.list());
          }
        }
        break;
      }
      default:
        break;
    }
    StartRead(&in_);
  }

  void Apply(const v1::ResponseList& list) {
    int answered = 0;
    for (const v1::Response& r : list.responses()) {
      answered += std::max(r.names_size(), r.cache_ids_size());
    }
    absl::MutexLock lock(&mu_);
    for (const v1::CacheAssignment& a : list.cache_assignments()) ids_[a.name()] = a.id();
    answered_ += answered;
    if (answered_ >= expected_ && step_done_ != nullptr) {
      if (--*remaining_ == 0) step_done_->Notify();
      step_done_ = nullptr;
    }
  }

  // The ranks by job rank, for a relay (set before the first step).
  void SetRelayTargets(const std::vector<Rank*>* by_rank) { by_rank_ = by_rank; }

  void OnDone(const grpc::Status& status) override {
    absl::MutexLock lock(&mu_);
    done_ = true;
    final_ = status;
  }

  absl::Status WaitAssigned(absl::Duration timeout) {
    if (!assigned_.WaitForNotificationWithTimeout(timeout)) {
      return absl::DeadlineExceededError(absl::StrCat(worker_id_, ": no assignment"));
    }
    Write(RankUpdate(v1::RANK_STATE_STARTED));
    return absl::OkStatus();
  }

  void Submit(const std::vector<v1::TensorRequest>& tensors, std::atomic<int>* remaining,
              absl::Notification* done) {
    v1::WorkerMessage m;
    Prepare(tensors, remaining, done, m.mutable_requests());
    Write(std::move(m));
  }

  // This rank's batch for the step, in `b`.
  void Prepare(const std::vector<v1::TensorRequest>& tensors, std::atomic<int>* remaining,
               absl::Notification* done, v1::RequestBatch* b) {
    {
      absl::MutexLock lock(&mu_);
      b->set_job_id(assignment_.job().id());
      b->set_epoch(assignment_.epoch());
      b->set_rank(assignment_.rank());
      for (const v1::TensorRequest& t : tensors) {
        if (auto it = ids_.find(t.name()); it != ids_.end()) {
          b->add_cached_ids(it->second);
        } else {
          *b->add_requests() = t;
        }
      }
      answered_ = 0;
      expected_ = static_cast<int>(tensors.size());
      remaining_ = remaining;
      step_done_ = done;
    }
  }

  void Exit() { Write(RankUpdate(v1::RANK_STATE_EXITED)); }

  int rank() {
    absl::MutexLock lock(&mu_);
    return assignment_.rank();
  }

  v1::WorkerMessage RankUpdate(v1::RankState state) {
    v1::WorkerMessage m;
    v1::RankUpdate* u = m.mutable_rank_update();
    absl::MutexLock lock(&mu_);
    u->set_job_id(assignment_.job().id());
    u->set_epoch(assignment_.epoch());
    u->set_rank(assignment_.rank());
    u->set_state(state);
    return m;
  }

  // Ends the call and waits (bounded) for OnDone: the reactor must outlive it.
  void Finish(absl::Duration timeout) {
    context_.TryCancel();
    const absl::Time deadline = absl::Now() + timeout;
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithDeadline(absl::Condition(&done_), deadline);
  }

 private:
  const std::string worker_id_;
  const std::vector<Rank*>* by_rank_ = nullptr;  // a relay's: set before the first step
  grpc::ClientContext context_;
  v1::CoordinatorMessage in_;
  absl::Notification assigned_;

  absl::Mutex mu_;
  std::deque<v1::WorkerMessage> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  v1::JobAssignment assignment_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint32_t> ids_ ABSL_GUARDED_BY(mu_);
  int answered_ ABSL_GUARDED_BY(mu_) = 0;
  int expected_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int>* remaining_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Notification* step_done_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<CallbackRanks>> CallbackRanks::Connect(
    std::shared_ptr<grpc::Channel> channel, int ranks, int per_host, absl::Duration timeout,
    bool relay, int relay_hosts) {
  auto stub = v1::WorkerService::NewStub(channel);
  std::unique_ptr<CallbackRanks> out(new CallbackRanks);
  out->relay_ = relay;
  out->relay_hosts_ = std::max(1, relay_hosts);
  out->per_host_ = std::max(1, per_host);
  for (int r = 0; r < ranks; ++r) {
    v1::RegisterWorkerRequest request;
    request.set_host(absl::StrCat("sim-", r / std::max(1, per_host)));
    request.set_device("cpu");
    v1::RegisterWorkerResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    if (grpc::Status s = stub->RegisterWorker(&context, request, &response); !s.ok()) {
      return absl::UnavailableError(absl::StrCat("RegisterWorker: ", s.error_message()));
    }
    out->ranks_.push_back(
        std::make_unique<Rank>(stub.get(), response.worker_id(), response.session_secret()));
    if (response.heartbeat_interval_ms() > 0) {
      out->heartbeat_interval_ = absl::Milliseconds(response.heartbeat_interval_ms());
    }
  }
  out->heartbeats_ = std::thread([sim = out.get()] {
    while (!sim->stop_heartbeats_.WaitForNotificationWithTimeout(sim->heartbeat_interval_)) {
      for (auto& r : sim->ranks_) {
        v1::WorkerMessage m;
        m.mutable_heartbeat();
        r->Write(std::move(m));
      }
    }
  });
  // The stub only starts calls; the reactors hold the channel through their contexts.
  return out;
}

CallbackRanks::~CallbackRanks() {
  if (!stop_heartbeats_.HasBeenNotified()) stop_heartbeats_.Notify();
  if (heartbeats_.joinable()) heartbeats_.join();
  for (auto& r : ranks_) r->Finish(absl::Seconds(5));
}

absl::Status CallbackRanks::WaitAssignments(absl::Duration timeout) {
  by_rank_.assign(ranks_.size(), nullptr);
  std::vector<std::string> host_names(ranks_.size());
  for (size_t i = 0; i < ranks_.size(); ++i) {
    auto& r = ranks_[i];
    if (absl::Status s = r->WaitAssigned(timeout); !s.ok()) return s;
    const int rank = r->rank();
    if (rank < 0 || rank >= static_cast<int>(by_rank_.size())) {
      return absl::InternalError(absl::StrCat("assigned rank ", rank, " of ", by_rank_.size()));
    }
    by_rank_[rank] = r.get();
    host_names[rank] = absl::StrCat("sim-", i / per_host_);
  }
  if (!relay_) return absl::OkStatus();
  // The job's relays, as its worker daemons would work them out.
  // Registered without authentication: one (empty) identity.
  std::vector<RelayMember> members;
  for (const std::string& host : host_names) members.push_back({host, ""});
  const std::vector<int32_t> relay_of = PlanRelays(members, relay_hosts_);
  std::map<int32_t, std::vector<int>> groups;
  direct_.clear();
  for (int rank = 0; rank < static_cast<int>(relay_of.size()); ++rank) {
    if (relay_of[rank] < 0) {
      direct_.push_back(rank);  // alone in its group: on its own session
    } else {
      groups[relay_of[rank]].push_back(rank);  // the relay comes first
    }
  }
  groups_.clear();
  for (auto& [relay, members] : groups) {
    by_rank_[relay]->SetRelayTargets(&by_rank_);
    groups_.push_back(std::move(members));
  }
  return absl::OkStatus();
}

absl::Status CallbackRanks::Step(const std::vector<v1::TensorRequest>& tensors,
                                 absl::Duration timeout, absl::Time* last_sent) {
  std::atomic<int> remaining{static_cast<int>(ranks_.size())};
  absl::Notification done;
  if (!relay_) {
    for (auto& r : ranks_) r->Submit(tensors, &remaining, &done);
  } else {
    for (int rank : direct_) by_rank_[rank]->Submit(tensors, &remaining, &done);
    // Each relay sends its group's batches in one message.
    for (const std::vector<int>& group : groups_) {
      v1::WorkerMessage m;
      for (int rank : group) {
        by_rank_[rank]->Prepare(tensors, &remaining, &done, m.mutable_relayed()->add_batches());
      }
      ShareCachedIds(m.mutable_relayed());  // as a worker daemon's relay does
      by_rank_[group.front()]->Write(std::move(m));
    }
  }
  if (last_sent != nullptr) *last_sent = absl::Now();
  if (!done.WaitForNotificationWithTimeout(timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat(remaining.load(), " ranks still waiting for their answers"));
  }
  return absl::OkStatus();
}

void CallbackRanks::Close() {
  for (auto& r : ranks_) r->Exit();
}

}  // namespace ringmaster
