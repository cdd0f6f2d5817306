#include "worker/engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/half.h"
#include "common/tensor.h"
#include "spdlog/spdlog.h"

namespace ringmaster {
namespace {

int64_t ByteSize(const v1::TensorRequest& r) {
  int64_t n = DataTypeSize(static_cast<DataType>(r.dtype()));
  for (int64_t d : r.shape()) n *= d;
  return n;
}

v1::LocalCompletion StatusCompletion(const absl::Status& status) {
  v1::LocalCompletion c;
  c.set_code(static_cast<int>(status.code()));
  c.set_message(std::string(status.message()));
  return c;
}

template <typename T>
void ScaleInts(T* p, int64_t n, double factor, int divisor) {
  for (int64_t i = 0; i < n; ++i) {
    if (divisor > 1 && factor == 1.0) {
      p[i] = static_cast<T>(p[i] / divisor);
    } else {
      p[i] = static_cast<T>(std::llround(static_cast<double>(p[i]) * factor / divisor));
    }
  }
}

template <typename T>
void ScaleFloats(T* p, int64_t n, double factor) {
  const T f = static_cast<T>(factor);  // in the tensor's own type, so the loop vectorises
  for (int64_t i = 0; i < n; ++i) p[i] *= f;
}

// Multiplies `n` elements by factor / divisor. Integers are divided exactly (truncating toward
// zero, as C++ and PyTorch's integer division of a sum do) when only averaging, rounded otherwise.
void Scale(void* data, int64_t n, DataType dtype, double factor, int divisor) {
  if (factor == 1.0 && divisor == 1) return;
  switch (dtype) {
    case DataType::kUint8:
      ScaleInts(static_cast<uint8_t*>(data), n, factor, divisor);
      break;
    case DataType::kInt8:
      ScaleInts(static_cast<int8_t*>(data), n, factor, divisor);
      break;
    case DataType::kInt32:
      ScaleInts(static_cast<int32_t*>(data), n, factor, divisor);
      break;
    case DataType::kInt64:
      ScaleInts(static_cast<int64_t*>(data), n, factor, divisor);
      break;
    case DataType::kFloat32:
      ScaleFloats(static_cast<float*>(data), n, factor / divisor);
      break;
    case DataType::kFloat64:
      ScaleFloats(static_cast<double*>(data), n, factor / divisor);
      break;
    case DataType::kFloat16: {
      auto* p = static_cast<uint16_t*>(data);
      const float f = static_cast<float>(factor / divisor);
      for (int64_t i = 0; i < n; ++i) p[i] = FloatToHalf(HalfToFloat(p[i]) * f);
      break;
    }
    case DataType::kBfloat16: {
      auto* p = static_cast<uint16_t*>(data);
      const float f = static_cast<float>(factor / divisor);
      for (int64_t i = 0; i < n; ++i) p[i] = FloatToBfloat16(Bfloat16ToFloat(p[i]) * f);
      break;
    }
    case DataType::kUnspecified:
      break;
  }
}

}  // namespace

Engine::Engine(EngineOptions options)
    : options_(std::move(options)),
      metrics_(options_.metrics != nullptr ? options_.metrics : &own_metrics_),
      record_(options_.metrics != nullptr),
      labels_({{"job", options_.job_id},
               {"rank", absl::StrCat(options_.rank)},
               {"host", options_.host}}),
      cycle_time_(options_.cycle_time) {
  const char* ops[] = {"allreduce", "broadcast", "allgather", "barrier"};
  for (int i = 0; i < 4; ++i) {
    Labels with_op = labels_;
    with_op.emplace_back("op", ops[i]);
    if (i < 3) {
      series_.bytes[i] = &metrics_->GetCounter(
          "ringmaster_collective_bytes_total",
          "Bytes this rank contributed to collectives (allreduce, broadcast, allgather).", with_op);
    }
    series_.latency[i] = &metrics_->GetHistogram(
        "ringmaster_collective_latency_seconds",
        "Time to execute one response (pack, collective, scale, unpack), by collective.",
        ExponentialBuckets(0.00005, 2, 18), with_op);
  }
  series_.fused_tensors = &metrics_->GetHistogram("ringmaster_fused_tensors",
                                                  "Tensors per executed allreduce response.",
                                                  ExponentialBuckets(1, 2, 11), labels_);
  series_.fill_ratio =
      &metrics_->GetHistogram("ringmaster_fusion_buffer_fill_ratio",
                              "Bytes of an allreduce response divided by the fusion threshold.",
                              {0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 1}, labels_);
  series_.bus_bandwidth = &metrics_->GetGauge(
      "ringmaster_bus_bandwidth_bytes_per_second",
      "Bus bandwidth of the last allreduce response: 2(n-1)/n x bytes / time.", labels_);
  series_.queue_depth = &metrics_->GetGauge(
      "ringmaster_queue_depth", "Collectives enqueued by the training process and not yet done.",
      labels_);
  // Every kind exists from the start at 0, so rate() counts the first error too.
  for (const char* kind : {"negotiation", "peer", "job_stopped", "other"}) {
    Labels with_kind = labels_;
    with_kind.emplace_back("kind", kind);
    metrics_->GetCounter("ringmaster_errors_total", "Collectives that failed, by kind of error.",
                         with_kind);
  }
}

void Engine::CountError(absl::string_view kind) {
  if (!record_) return;
  Labels with_kind = labels_;
  with_kind.emplace_back("kind", std::string(kind));
  metrics_
      ->GetCounter("ringmaster_errors_total", "Collectives that failed, by kind of error.",
                   with_kind)
      .Increment();
}

Engine::~Engine() {
  Stop();
  // The rank is gone: its levels drop to zero rather than freeze at their last value.
  series_.queue_depth->Set(0);
  series_.bus_bandwidth->Set(0);
}

void Engine::Start() {
  thread_ = std::thread([this] { Loop(); });
}

std::string Engine::RankName() const {
  return absl::StrCat("rank ", options_.rank, " (", options_.host, ")");
}

void Engine::Enqueue(const v1::LocalEnqueue& enqueue, Done done) {
  const v1::TensorRequest& r = enqueue.request();
  auto reject = [&](absl::Status status) { done(StatusCompletion(status)); };
  if (r.name().empty()) return reject(absl::InvalidArgumentError("tensor name is empty"));
  const bool has_data = r.type() == v1::REQUEST_TYPE_ALLREDUCE ||
                        r.type() == v1::REQUEST_TYPE_ALLGATHER ||
                        r.type() == v1::REQUEST_TYPE_BROADCAST;
  if (has_data) {
    const int64_t bytes = ByteSize(r);
    if (enqueue.offset() < 0 || bytes < 0 ||
        static_cast<uint64_t>(enqueue.offset()) + static_cast<uint64_t>(bytes) >
            options_.arena_bytes) {
      return reject(absl::InvalidArgumentError(absl::StrCat(
          "tensor '", r.name(), "': ", bytes, " bytes at arena offset ", enqueue.offset(),
          " lie outside the ", options_.arena_bytes, "-byte arena")));
    }
  }
  absl::Status rejected;
  {
    absl::MutexLock lock(&mu_);
    if (!aborted_.ok()) {
      rejected = aborted_;
    } else if (ops_.contains(r.name())) {
      rejected = absl::InvalidArgumentError(
          absl::StrCat("Tensor '", r.name(), "' is already in flight on ", RankName(),
                       ": wait for it to complete before submitting it again, or use a different "
                       "name."));
    } else {
      ops_[r.name()] = std::make_unique<Op>(Op{enqueue, std::move(done)});
      if (r.type() == v1::REQUEST_TYPE_JOIN) joined_ = true;
      unsent_.push_back(r);
      if (record_) series_.queue_depth->Set(static_cast<double>(ops_.size()));
      return;
    }
  }
  reject(rejected);  // outside the lock: the reply is a socket write
}

void Engine::OnResponses(v1::ResponseList list) {
  const absl::Time now = options_.timeline ? absl::Now() : absl::InfinitePast();
  absl::MutexLock lock(&mu_);
  responses_.push_back({std::move(list), now});
}

void Engine::Abort(const absl::Status& status) {
  // A collective stuck on a lost peer must return: abort the communicator (never a blocking
  // destroy); the engine thread's wait then fails.
  if (options_.device != nullptr && !status.ok())
    options_.device->Abort(std::string(status.message()));
  absl::flat_hash_map<std::string, std::unique_ptr<Op>> ops;
  {
    absl::MutexLock lock(&mu_);
    if (aborted_.ok()) aborted_ = status;
    ops.swap(ops_);
    unsent_.clear();
    responses_.clear();
  }
  for (auto& [name, op] : ops) op->done(StatusCompletion(status));
}

void Engine::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  Abort(absl::CancelledError(absl::StrCat("job ", options_.job_id, " stopped on ", RankName())));
  if (thread_.joinable()) thread_.join();
}

bool Engine::Stopping() {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

void Engine::Loop() {
  if (options_.device != nullptr) {
    backend_status_ = options_.device->Setup();
    device_ready_ = backend_status_.ok();
    if (!device_ready_) {
      spdlog::error("job {} {}: communicator: {}", options_.job_id, RankName(),
                    backend_status_.ToString());
      Abort(absl::UnavailableError(absl::StrCat("communicator setup failed on ", RankName(), ": ",
                                                backend_status_.message())));
    }
  }
  for (int i = 0; options_.device == nullptr && options_.make_backend &&
                  i < std::max(1, options_.communicators);
       ++i) {
    absl::StatusOr<std::unique_ptr<Backend>> backend = options_.make_backend(i);
    if (backend.ok()) {
      backends_.push_back(*std::move(backend));
      backend_ = backends_.front().get();
    } else {
      backends_.clear();
      backend_ = nullptr;
      backend_status_ = backend.status();
      if (backend_status_.code() == absl::StatusCode::kFailedPrecondition || Stopping()) {
        // The job ended while its ranks were still meeting (a command that exits at once): its
        // rendezvous is closed, which is no error of this rank.
        spdlog::info("job {} {}: no communicator, the job ended: {}", options_.job_id, RankName(),
                     std::string(backend_status_.message()));
      } else {
        spdlog::error("job {} {}: communicator: {}", options_.job_id, RankName(),
                      backend_status_.ToString());
      }
      Abort(absl::UnavailableError(absl::StrCat("communicator setup failed on ", RankName(), ": ",
                                                backend_status_.message())));
      break;
    }
  }
  while (true) {
    std::vector<v1::TensorRequest> batch;
    std::deque<Arrived> lists;
    {
      absl::MutexLock lock(&mu_);
      // Wake for responses at once. Requests go out at most once per cycle: at once when the last
      // batch left a cycle ago or more, else when that cycle ends (so tensors enqueued meanwhile
      // travel, and can be fused, together).
      const bool had_unsent = !unsent_.empty();
      auto due = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !unsent_.empty() && absl::Now() >= last_sent_ + cycle_time_;
      };
      auto ready = [this, had_unsent, &due]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !responses_.empty() || (!had_unsent && !unsent_.empty()) || due();
      };
      const absl::Time deadline =
          unsent_.empty() ? absl::Now() + absl::Milliseconds(50) : last_sent_ + cycle_time_;
      mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
      if (stopping_) return;
      if (due()) {
        batch.swap(unsent_);
        last_sent_ = absl::Now();
      }
      lists.swap(responses_);
    }
    if (!batch.empty()) SendBatch(batch);
    for (Arrived& a : lists) Process(a.list, a.time);
  }
}

void Engine::SendBatch(const std::vector<v1::TensorRequest>& requests) {
  v1::WorkerMessage m;
  v1::RequestBatch* b = m.mutable_requests();
  b->set_job_id(options_.job_id);
  b->set_epoch(options_.epoch);
  b->set_rank(options_.rank);
  for (const v1::TensorRequest& r : requests) {
    if (uint32_t id = cache_.Find(r); id != 0) {
      b->add_cached_ids(id);
    } else {
      *b->add_requests() = r;
    }
  }
  options_.send(m);
}

std::vector<Engine::Op*> Engine::Take(const std::vector<std::string>& names) {
  std::vector<Op*> out;
  absl::MutexLock lock(&mu_);
  for (const std::string& name : names) {
    auto it = ops_.find(name);
    out.push_back(it == ops_.end() ? nullptr : it->second.release());
    if (it != ops_.end()) ops_.erase(it);
  }
  return out;
}

void Engine::Complete(Op* op, const absl::Status& status, v1::LocalCompletion completion) {
  if (op == nullptr) return;
  if (!status.ok()) {
    completion = StatusCompletion(status);
    CountError(status.code() == absl::StatusCode::kFailedPrecondition ? "negotiation"
               : status.code() == absl::StatusCode::kUnavailable      ? "peer"
               : status.code() == absl::StatusCode::kAborted          ? "job_stopped"
                                                                      : "other");
  }
  completion.set_handle(op->enqueue.handle());
  op->done(completion);
  delete op;
}

void Engine::Process(v1::ResponseList& list, absl::Time arrived) {
  fusion_threshold_ = list.fusion_threshold_bytes();
  if (list.cycle_time_ms() > 0) {
    absl::MutexLock lock(&mu_);
    cycle_time_ = absl::Microseconds(static_cast<int64_t>(list.cycle_time_ms() * 1000));
  }
  for (uint32_t id : list.evicted_ids()) cache_.Evict(id);
  {
    absl::MutexLock lock(&mu_);
    for (const v1::CacheAssignment& a : list.cache_assignments()) {
      if (auto it = ops_.find(a.name()); it != ops_.end()) {
        cache_.Assign(a.name(), a.id(), it->second->enqueue.request());
      }
    }
  }
  if (list.resend_ids_size() > 0) {
    v1::WorkerMessage m;
    v1::RequestBatch* b = m.mutable_requests();
    b->set_job_id(options_.job_id);
    b->set_epoch(options_.epoch);
    b->set_rank(options_.rank);
    for (uint32_t id : list.resend_ids()) {
      if (std::optional<v1::TensorRequest> r = cache_.TakeForResend(id)) *b->add_requests() = *r;
    }
    options_.send(m);
  }
  for (const v1::Response& e : list.rank_errors()) {
    std::vector<std::string> names(e.names().begin(), e.names().end());
    for (Op* op : Take(names)) {
      Complete(op, absl::FailedPreconditionError(e.error_message()));
    }
  }
  for (const v1::Response& r : list.responses()) {
    const int n = std::max(r.names_size(), r.cache_ids_size());
    std::vector<std::string> names(n);
    for (int i = 0; i < n; ++i) {
      if (i < r.names_size() && !r.names(i).empty()) {
        names[i] = r.names(i);
      } else if (i < r.cache_ids_size()) {
        if (const std::string* name = cache_.NameOf(r.cache_ids(i))) names[i] = *name;
      }
    }
    Activities activities(options_.timeline && r.type() != v1::Response::TYPE_ERROR &&
                              r.type() != v1::Response::TYPE_JOIN,
                          arrived);
    // Waiting behind the earlier responses of the list.
    activities.End("QUEUE");
    Execute(r, names, activities);
  }
}

void Engine::SendSpan(const v1::Response& r, const std::vector<std::string>& names,
                      Activities& activities) {
  if (!options_.timeline || activities.ends().size() < 2) return;
  v1::WorkerMessage message;
  v1::TimelineSpans& spans = *message.mutable_timeline();
  spans.set_job_id(options_.job_id);
  spans.set_epoch(options_.epoch);
  spans.set_rank(options_.rank);
  v1::ExecutionSpan* span = spans.add_spans();
  for (const std::string& name : names) {
    if (!name.empty()) span->add_tensors(name);
  }
  if (span->tensors_size() == 0) return;
  const char* ops[] = {"", "ALLREDUCE", "ALLGATHER", "BROADCAST", "JOIN", "BARRIER", "ERROR"};
  span->set_op(ops[std::clamp<int>(r.type(), 0, 6)]);
  span->set_start_unix_us(absl::ToUnixMicros(activities.arrived()));
  for (const auto& [activity, end] : activities.ends()) {
    span->add_activities(activity);
    span->add_activity_end_unix_us(end);
  }
  options_.send(message);
}

void Engine::Execute(const v1::Response& r, const std::vector<std::string>& names,
                     Activities& activities) {
  if (r.type() == v1::Response::TYPE_JOIN) {
    {
      absl::MutexLock lock(&mu_);
      joined_ = false;
    }
    std::vector<std::string> join_names;
    {
      absl::MutexLock lock(&mu_);
      for (auto& [name, op] : ops_) {
        if (op->enqueue.request().type() == v1::REQUEST_TYPE_JOIN) join_names.push_back(name);
      }
    }
    for (Op* op : Take(join_names)) {
      v1::LocalCompletion c;
      c.set_last_joined_rank(r.last_joined_rank());
      Complete(op, absl::OkStatus(), c);
    }
    return;
  }
  std::vector<Op*> ops = Take(names);
  if (r.type() == v1::Response::TYPE_ERROR) {
    for (Op* op : ops) Complete(op, absl::FailedPreconditionError(r.error_message()));
    return;
  }
  absl::Status status;
  std::vector<v1::LocalCompletion> completions(ops.size());
  const absl::Time started = absl::Now();
  if (options_.device != nullptr) {
    status = device_ready_ ? ExecuteOnDevice(r, ops, &completions, activities)
                           : absl::UnavailableError(absl::StrCat("no communicator on ", RankName(),
                                                                 ": ", backend_status_.message()));
  } else if (backend_ == nullptr) {
    status = absl::UnavailableError(
        absl::StrCat("no communicator on ", RankName(), ": ", backend_status_.message()));
  } else if (r.type() == v1::Response::TYPE_ALLREDUCE) {
    status = ExecuteAllreduce(r, ops, activities);
  } else if (r.type() == v1::Response::TYPE_ALLGATHER) {
    status = ExecuteAllgather(r, ops, &completions);
    activities.End("GLOO_ALLGATHER");
  } else if (r.type() == v1::Response::TYPE_BROADCAST) {
    const int64_t bytes = r.tensor_sizes_size() > 0
                              ? r.tensor_sizes(0) * DataTypeSize(static_cast<DataType>(r.dtype()))
                              : 0;
    uint8_t* data;
    if (ops[0] != nullptr) {
      data = options_.arena + ops[0]->enqueue.offset();
    } else {  // joined: take part with scratch memory
      fusion_buffer_.resize(std::max<size_t>(fusion_buffer_.size(), bytes));
      data = fusion_buffer_.data();
    }
    status = backend_->Broadcast(data, bytes, r.root_rank());
    activities.End("GLOO_BCAST");
  } else if (r.type() == v1::Response::TYPE_BARRIER) {
    status = backend_->Barrier();
    activities.End("GLOO_BARRIER");
  } else {
    status = absl::InternalError(absl::StrCat("unknown response type ", r.type()));
  }
  if (status.ok() && (backend_ != nullptr || device_ready_)) Record(r, ops, absl::Now() - started);
  // Before completing: a rank that finishes at once and exits must not overtake its last span (the
  // job, and its timeline, would end without it).
  SendSpan(r, names, activities);
  for (size_t i = 0; i < ops.size(); ++i) Complete(ops[i], status, completions[i]);
  if (record_) {
    absl::MutexLock lock(&mu_);
    series_.queue_depth->Set(static_cast<double>(ops_.size()));
  }
  // A failed collective leaves the communicator unusable, and on a GPU any failure may leave this
  // rank out of step with its peers (NCCL matches calls by order): fail everything else too.
  if (!status.ok() &&
      (status.code() != absl::StatusCode::kInvalidArgument || options_.device != nullptr)) {
    // The communicator is unusable after a failed collective: fail everything else too.
    Abort(status);
  }
}

void Engine::Record(const v1::Response& r, const std::vector<Op*>& ops, absl::Duration took) {
  if (!record_) return;
  const double seconds = absl::ToDoubleSeconds(took);
  const int64_t elem = DataTypeSize(static_cast<DataType>(r.dtype()));
  int64_t bytes = 0;
  if (r.type() == v1::Response::TYPE_ALLGATHER) {
    for (Op* op : ops) {
      if (op != nullptr) bytes += ByteSize(op->enqueue.request());
    }
  } else {
    for (int64_t n : r.tensor_sizes()) bytes += n * elem;
  }
  switch (r.type()) {
    case v1::Response::TYPE_ALLREDUCE: {
      series_.bytes[0]->Increment(static_cast<double>(bytes));
      series_.latency[0]->Observe(seconds);
      series_.fused_tensors->Observe(static_cast<double>(ops.size()));
      if (fusion_threshold_ > 0) {
        series_.fill_ratio->Observe(static_cast<double>(bytes) /
                                    static_cast<double>(fusion_threshold_));
      }
      const int n = options_.size;
      if (seconds > 0 && n > 1) {
        series_.bus_bandwidth->Set(2.0 * (n - 1) / n * static_cast<double>(bytes) / seconds);
      }
      break;
    }
    case v1::Response::TYPE_BROADCAST:
      series_.bytes[1]->Increment(static_cast<double>(bytes));
      series_.latency[1]->Observe(seconds);
      break;
    case v1::Response::TYPE_ALLGATHER:
      series_.bytes[2]->Increment(static_cast<double>(bytes));
      series_.latency[2]->Observe(seconds);
      break;
    case v1::Response::TYPE_BARRIER:
      series_.latency[3]->Observe(seconds);
      break;
    default:
      break;
  }
}

absl::Status Engine::ExecuteAllreduce(const v1::Response& r, const std::vector<Op*>& ops,
                                      Activities& activities) {
  const auto dtype = static_cast<DataType>(r.dtype());
  const int64_t elem = DataTypeSize(dtype);
  std::vector<int64_t> counts(ops.size());
  int64_t total = 0;
  bool contiguous = true;
  for (size_t i = 0; i < ops.size(); ++i) {
    counts[i] = i < static_cast<size_t>(r.tensor_sizes_size()) ? r.tensor_sizes(i) : 0;
    total += counts[i];
    if (ops[i] == nullptr) {
      contiguous = false;
    } else if (i > 0 && ops[i - 1] != nullptr &&
               ops[i - 1]->enqueue.offset() + counts[i - 1] * elem != ops[i]->enqueue.offset()) {
      contiguous = false;
    }
  }
  uint8_t* buffer;
  if (contiguous && !ops.empty()) {
    buffer = options_.arena + ops[0]->enqueue.offset();  // already one buffer: no pack, no unpack
  } else {
    fusion_buffer_.resize(std::max<size_t>(fusion_buffer_.size(), total * elem));
    buffer = fusion_buffer_.data();
    int64_t at = 0;
    for (size_t i = 0; i < ops.size(); ++i) {
      const size_t bytes = counts[i] * elem;
      if (ops[i] != nullptr) {
        std::memcpy(buffer + at, options_.arena + ops[i]->enqueue.offset(), bytes);
      } else {
        std::memset(buffer + at, 0, bytes);  // a joined rank contributes zeros
      }
      at += bytes;
    }
    activities.End("MEMCPY_IN_FUSION_BUFFER");
  }
  auto op = static_cast<ReduceOp>(r.reduce_op());
  const bool average = op == ReduceOp::kAverage || op == ReduceOp::kUnspecified;
  const double prescale = r.prescale_factor() == 0 ? 1.0 : r.prescale_factor();
  const double postscale = r.postscale_factor() == 0 ? 1.0 : r.postscale_factor();
  const ReduceOp backend_op = average ? ReduceOp::kSum : op;
  const int divisor = average ? options_.size : 1;
  // Split into one chunk per communicator (the same split on every rank) and run them concurrently;
  // each chunk is scaled by the thread that reduces it.
  const int parts = total * elem >= options_.split_bytes ? static_cast<int>(backends_.size()) : 1;
  std::vector<absl::Status> statuses(parts);
  auto run = [&](int part) {
    const int64_t begin = total * part / parts, end = total * (part + 1) / parts;
    uint8_t* data = buffer + begin * elem;
    Scale(data, end - begin, dtype, prescale, 1);
    statuses[part] = backends_[part]->Allreduce(data, end - begin, dtype, backend_op);
    if (statuses[part].ok()) Scale(data, end - begin, dtype, postscale, divisor);
  };
  std::vector<std::thread> helpers;
  for (int part = 1; part < parts; ++part) helpers.emplace_back(run, part);
  run(0);
  for (auto& t : helpers) t.join();
  activities.End("GLOO_ALLREDUCE");  // failed or not: the timeline shows where the time went
  for (const absl::Status& status : statuses) {
    if (!status.ok()) return status;
  }
  if (buffer == fusion_buffer_.data()) {
    int64_t at = 0;
    for (size_t i = 0; i < ops.size(); ++i) {
      const size_t bytes = counts[i] * elem;
      if (ops[i] != nullptr)
        std::memcpy(options_.arena + ops[i]->enqueue.offset(), buffer + at, bytes);
      at += bytes;
    }
    activities.End("MEMCPY_OUT_FUSION_BUFFER");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Engine::AllgatherPart>> Engine::PlanAllgather(
    const v1::Response& r, const std::vector<Op*>& ops) const {
  const int64_t elem = DataTypeSize(static_cast<DataType>(r.dtype()));
  const int size = options_.size;
  if (static_cast<size_t>(r.tensor_sizes_size()) < ops.size() * size) {
    return absl::InvalidArgumentError(absl::StrCat("allgather response has ", r.tensor_sizes_size(),
                                                   " sizes for ", ops.size(), " tensors on ", size,
                                                   " ranks"));
  }
  std::vector<AllgatherPart> parts(ops.size());
  for (size_t t = 0; t < ops.size(); ++t) {
    AllgatherPart& part = parts[t];
    if (ops[t] != nullptr) {
      const auto& s = ops[t]->enqueue.request().shape();
      part.shape.assign(s.begin(), s.end());
    }
    // Row size from the response (every rank the same; a joined rank has no shape of its own),
    // else from this rank's shape.
    int64_t row = elem;
    if (t < static_cast<size_t>(r.row_elements_size())) {
      row *= r.row_elements(static_cast<int>(t));
    } else {
      for (size_t d = 1; d < part.shape.size(); ++d) row *= part.shape[d];
    }
    part.bytes.resize(size);
    for (int k = 0; k < size; ++k) {
      const int64_t first = r.tensor_sizes(static_cast<int>(t) * size + k);
      part.bytes[k] = first * row;
      part.rows += first;
    }
    part.total = part.rows * row;
  }
  return parts;
}

void Engine::SetAllgatherOutput(const AllgatherPart& part, size_t offset,
                                v1::LocalCompletion* completion) {
  completion->set_output_offset(static_cast<int64_t>(offset));
  completion->add_output_shape(part.rows);
  for (size_t d = 1; d < part.shape.size(); ++d) completion->add_output_shape(part.shape[d]);
}

absl::Status Engine::ExecuteOnDevice(const v1::Response& r, const std::vector<Op*>& ops,
                                     std::vector<v1::LocalCompletion>* completions,
                                     Activities& activities) {
  DeviceExecutor& device = *options_.device;
  const auto dtype = static_cast<DataType>(r.dtype());
  const int64_t elem = DataTypeSize(dtype);
  auto tensor = [&](size_t i, int64_t count) {
    DeviceExecutor::Tensor t;
    t.count = count;
    if (ops[i] != nullptr) {
      t.offset = ops[i]->enqueue.offset();
      t.ready_event = ops[i]->enqueue.ready_event();
    }
    return t;
  };
  absl::StatusOr<int32_t> done = 0;
  switch (r.type()) {
    case v1::Response::TYPE_ALLREDUCE: {
      std::vector<DeviceExecutor::Tensor> tensors;
      for (size_t i = 0; i < ops.size(); ++i) {
        tensors.push_back(
            tensor(i, i < static_cast<size_t>(r.tensor_sizes_size()) ? r.tensor_sizes(i) : 0));
      }
      done = device.Allreduce(tensors, dtype, static_cast<ReduceOp>(r.reduce_op()),
                              r.prescale_factor() == 0 ? 1.0 : r.prescale_factor(),
                              r.postscale_factor() == 0 ? 1.0 : r.postscale_factor());
      activities.End("NCCL_ALLREDUCE");
      break;
    }
    case v1::Response::TYPE_BROADCAST: {
      const int64_t count = r.tensor_sizes_size() > 0 ? r.tensor_sizes(0) : 0;
      done = device.Broadcast(tensor(0, count), count * elem, r.root_rank());
      activities.End("NCCL_BCAST");
      break;
    }
    case v1::Response::TYPE_ALLGATHER: {
      absl::StatusOr<std::vector<AllgatherPart>> parts = PlanAllgather(r, ops);
      if (!parts.ok()) return parts.status();
      for (size_t t = 0; t < ops.size() && done.ok(); ++t) {
        const AllgatherPart& part = (*parts)[t];
        absl::StatusOr<size_t> out = options_.outputs->Allocate(part.total);
        if (!out.ok()) {
          done = out.status();
          break;
        }
        done = device.Allgather(tensor(t, part.bytes[options_.rank] / elem),
                                static_cast<int64_t>(*out), part.bytes);
        if (!done.ok() || ops[t] == nullptr) {
          options_.outputs->Free(*out).IgnoreError();
          continue;
        }
        SetAllgatherOutput(part, *out, &(*completions)[t]);
      }
      activities.End("NCCL_ALLGATHER");
      break;
    }
    case v1::Response::TYPE_BARRIER: {
      absl::Status s = device.Barrier();
      activities.End("NCCL_BARRIER");
      if (!s.ok()) return s;
      break;
    }
    default:
      return absl::InternalError(absl::StrCat("unknown response type ", r.type()));
  }
  if (!done.ok()) {
    // Outputs allocated for earlier tensors go back to the arena.
    for (v1::LocalCompletion& c : *completions) {
      if (c.output_shape_size() > 0) options_.outputs->Free(c.output_offset()).IgnoreError();
      c.clear_output_shape();
    }
    return done.status();
  }
  for (v1::LocalCompletion& c : *completions) c.set_done_event(*done);
  return absl::OkStatus();
}

absl::Status Engine::ExecuteAllgather(const v1::Response& r, const std::vector<Op*>& ops,
                                      std::vector<v1::LocalCompletion>* out) {
  absl::StatusOr<std::vector<AllgatherPart>> parts = PlanAllgather(r, ops);
  if (!parts.ok()) return parts.status();
  // On failure, outputs already allocated for earlier tensors go back to the arena.
  auto release_earlier = [&](size_t upto) {
    for (size_t e = 0; e < upto; ++e) {
      if (ops[e] != nullptr) options_.outputs->Free((*out)[e].output_offset()).IgnoreError();
    }
  };
  for (size_t t = 0; t < ops.size(); ++t) {
    const AllgatherPart& part = (*parts)[t];
    uint8_t* output;
    absl::StatusOr<size_t> offset = absl::UnavailableError("");
    if (ops[t] != nullptr) {
      offset = options_.outputs->Allocate(part.total);
      if (!offset.ok()) {
        release_earlier(t);
        return offset.status();
      }
      output = options_.arena + *offset;
    } else {
      fusion_buffer_.resize(std::max<size_t>(fusion_buffer_.size(), part.total));
      output = fusion_buffer_.data();
    }
    const uint8_t* input = ops[t] != nullptr ? options_.arena + ops[t]->enqueue.offset() : output;
    absl::Status status = backend_->Allgatherv(input, output, part.bytes);
    if (!status.ok()) {
      if (offset.ok()) options_.outputs->Free(*offset).IgnoreError();
      release_earlier(t);
      return status;
    }
    if (ops[t] != nullptr) SetAllgatherOutput(part, *offset, &(*out)[t]);
  }
  return absl::OkStatus();
}

}  // namespace ringmaster
