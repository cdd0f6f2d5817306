#include "bench/callback_ranks.h"

#include <atomic>
#include <deque>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

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
      case v1::CoordinatorMessage::kResponses: {
        const v1::ResponseList& list = in_.responses();
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
        break;
      }
      default:
        break;
    }
    StartRead(&in_);
  }

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
    v1::RequestBatch* b = m.mutable_requests();
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
    Write(std::move(m));
  }

  void Exit() { Write(RankUpdate(v1::RANK_STATE_EXITED)); }

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
    std::shared_ptr<grpc::Channel> channel, int ranks, int per_host, absl::Duration timeout) {
  auto stub = v1::WorkerService::NewStub(channel);
  std::unique_ptr<CallbackRanks> out(new CallbackRanks);
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
  }
  // The stub only starts calls; the reactors hold the channel through their contexts.
  return out;
}

CallbackRanks::~CallbackRanks() {
  for (auto& r : ranks_) r->Finish(absl::Seconds(5));
}

absl::Status CallbackRanks::WaitAssignments(absl::Duration timeout) {
  for (auto& r : ranks_) {
    if (absl::Status s = r->WaitAssigned(timeout); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status CallbackRanks::Step(const std::vector<v1::TensorRequest>& tensors,
                                 absl::Duration timeout) {
  std::atomic<int> remaining{static_cast<int>(ranks_.size())};
  absl::Notification done;
  for (auto& r : ranks_) r->Submit(tensors, &remaining, &done);
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
