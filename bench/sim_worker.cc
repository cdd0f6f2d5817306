#include "bench/sim_worker.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/negotiation_wire.h"

namespace ringmaster {
namespace {

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

std::chrono::system_clock::time_point Deadline(absl::Duration timeout) {
  return std::chrono::system_clock::now() +
         std::chrono::microseconds(absl::ToInt64Microseconds(timeout));
}

}  // namespace

SimWorker::SimWorker(std::shared_ptr<grpc::Channel> channel, std::string host, std::string device)
    : host_(std::move(host)),
      device_(std::move(device)),
      stub_(v1::WorkerService::NewStub(std::move(channel))) {}

SimWorker::~SimWorker() { Close(); }

absl::Status SimWorker::Connect(absl::Duration timeout) {
  v1::RegisterWorkerRequest request;
  request.set_host(host_);
  request.set_device(device_);
  request.set_slot(absl::StrCat(host_, ":", device_));
  v1::RegisterWorkerResponse response;
  grpc::ClientContext context;
  context.set_deadline(Deadline(timeout));
  if (grpc::Status s = stub_->RegisterWorker(&context, request, &response); !s.ok()) {
    return FromGrpc(s);
  }
  worker_id_ = response.worker_id();
  secret_ = response.session_secret();
  stream_ = stub_->Session(&context_);
  v1::WorkerMessage open;
  open.mutable_open()->set_worker_id(worker_id_);
  open.mutable_open()->set_secret(secret_);
  if (absl::Status s = Send(open); !s.ok()) return s;
  reader_ = std::thread([this] { ReadLoop(); });
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return accepted_ || ended_; };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) {
    return absl::DeadlineExceededError("session not accepted in time");
  }
  if (!accepted_) return FromGrpc(final_status_);
  return absl::OkStatus();
}

void SimWorker::ReadLoop() {
  v1::CoordinatorMessage m;
  while (stream_->Read(&m)) {
    absl::MutexLock lock(&mu_);
    switch (m.kind_case()) {
      case v1::CoordinatorMessage::kAccepted:
        accepted_ = true;
        break;
      case v1::CoordinatorMessage::kAssignment:
        assignments_.push_back(m.assignment());
        break;
      case v1::CoordinatorMessage::kResponses:
        responses_.push_back(m.responses());
        break;
      case v1::CoordinatorMessage::kStopJob:
        stops_.push_back(m.stop_job());
        break;
      case v1::CoordinatorMessage::kRelayed:
        relayed_.push_back(m.relayed());
        break;
      default:
        break;
    }
  }
  grpc::Status status = stream_->Finish();
  absl::MutexLock lock(&mu_);
  final_status_ = status;
  ended_ = true;
}

template <typename T>
absl::StatusOr<T> SimWorker::Pop(std::deque<T>& queue, absl::Duration timeout, const char* what) {
  absl::MutexLock lock(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue.empty() || ended_; };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("no ", what, " within ", absl::FormatDuration(timeout)));
  }
  if (queue.empty()) {
    return absl::UnavailableError(absl::StrCat("session ended: ", final_status_.error_message()));
  }
  T value = std::move(queue.front());
  queue.pop_front();
  return value;
}

absl::StatusOr<v1::JobAssignment> SimWorker::WaitAssignment(absl::Duration timeout) {
  return Pop(assignments_, timeout, "assignment");
}

absl::StatusOr<v1::StopJob> SimWorker::WaitStop(absl::Duration timeout) {
  return Pop(stops_, timeout, "stop_job");
}

absl::StatusOr<v1::ResponseList> SimWorker::WaitResponses(absl::Duration timeout) {
  return Pop(responses_, timeout, "response list");
}

absl::StatusOr<v1::RelayedResponses> SimWorker::WaitRelayed(absl::Duration timeout) {
  return Pop(relayed_, timeout, "relayed response list");
}

absl::Status SimWorker::Send(const v1::WorkerMessage& message) {
  absl::MutexLock lock(&write_mu_);
  if (!stream_->Write(message)) return absl::UnavailableError("session stream is closed");
  return absl::OkStatus();
}

absl::Status SimWorker::SendRankUpdate(const v1::JobAssignment& a, v1::RankState state,
                                       int exit_code, const std::string& text) {
  v1::WorkerMessage m;
  v1::RankUpdate* u = m.mutable_rank_update();
  u->set_job_id(a.job().id());
  u->set_epoch(a.epoch());
  u->set_rank(a.rank());
  u->set_state(state);
  u->set_exit_code(exit_code);
  u->set_message(text);
  return Send(m);
}

absl::StatusOr<std::vector<v1::Response>> SimWorker::Negotiate(
    const v1::JobAssignment& a, const std::vector<v1::TensorRequest>& requests,
    absl::Duration timeout, bool resolve_names) {
  const absl::Time deadline = absl::Now() + timeout;
  // Steady state: the same tensors as last time and no cache change since: reuse the batch.
  const bool reuse = &requests == last_requests_ && requests.size() == last_size_ &&
                     cache_version_ == last_cache_version_ &&
                     last_batch_.requests().job_id() == a.job().id();
  if (!reuse) {
    last_batch_.Clear();
    v1::RequestBatch* batch = last_batch_.mutable_requests();
    batch->set_job_id(a.job().id());
    batch->set_epoch(a.epoch());
    batch->set_rank(a.rank());
    for (const v1::TensorRequest& r : requests) {
      TensorRequest plain;
      FromProto(r, &plain);
      if (uint32_t id = cache_.Find(plain); id != 0) {
        batch->add_cached_ids(id);
      } else {
        *batch->add_requests() = r;
      }
    }
    last_requests_ = &requests;
    last_size_ = requests.size();
    last_cache_version_ = cache_version_;
  }
  if (absl::Status s = Send(last_batch_); !s.ok()) return s;
  size_t answered = 0;
  std::vector<v1::Response> out;
  while (answered < requests.size()) {
    absl::StatusOr<v1::ResponseList> list = WaitResponses(deadline - absl::Now());
    if (!list.ok()) return list.status();
    if (list->evicted_ids_size() > 0 || list->cache_assignments_size() > 0 ||
        list->resend_ids_size() > 0) {
      ++cache_version_;
    }
    for (uint32_t id : list->evicted_ids()) cache_.Evict(id);
    if (list->cache_assignments_size() > 0) {
      absl::flat_hash_map<absl::string_view, const v1::TensorRequest*> by_name;
      for (const v1::TensorRequest& r : requests) by_name[r.name()] = &r;
      for (const v1::CacheAssignment& c : list->cache_assignments()) {
        auto it = by_name.find(c.name());
        if (it == by_name.end()) continue;
        TensorRequest plain;
        FromProto(*it->second, &plain);
        cache_.Assign(c.name(), c.id(), plain);
      }
    }
    if (list->resend_ids_size() > 0) {
      v1::WorkerMessage again;
      v1::RequestBatch* b = again.mutable_requests();
      b->set_job_id(a.job().id());
      b->set_epoch(a.epoch());
      b->set_rank(a.rank());
      for (uint32_t id : list->resend_ids()) {
        if (std::optional<TensorRequest> r = cache_.TakeForResend(id))
          ToProto(*r, b->add_requests());
      }
      if (absl::Status s = Send(again); !s.ok()) return s;
    }
    for (v1::Response& e : *list->mutable_rank_errors()) {
      answered += e.names_size();
      out.push_back(std::move(e));
    }
    for (v1::Response& r : *list->mutable_responses()) {
      answered += std::max(r.names_size(), r.cache_ids_size());
      if (resolve_names) {
        while (r.names_size() < r.cache_ids_size()) r.add_names();
        for (int i = 0; i < r.names_size(); ++i) {
          if (!r.names(i).empty() || i >= r.cache_ids_size()) continue;
          const std::string* name = cache_.NameOf(r.cache_ids(i));
          if (name == nullptr) {
            return absl::InternalError(
                absl::StrCat("response names unknown cache id ", r.cache_ids(i)));
          }
          r.set_names(i, *name);
        }
      }
      out.push_back(std::move(r));
    }
  }
  return out;
}

grpc::Status SimWorker::Close() {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return final_status_;
    closed_ = true;
  }
  if (stream_ != nullptr) {
    {
      absl::MutexLock lock(&write_mu_);
      stream_->WritesDone();
    }
    // The coordinator ends the stream once it sees our half-close; cancel if it does not in time.
    absl::MutexLock lock(&mu_);
    auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ended_; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&ended), absl::Seconds(5))) context_.TryCancel();
  }
  if (reader_.joinable()) reader_.join();
  absl::MutexLock lock(&mu_);
  return final_status_;
}

}  // namespace ringmaster
