#include "worker/engine.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
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

}  // namespace

Engine::Engine(EngineOptions options)
    : options_(std::move(options)),
      metrics_(options_.metrics != nullptr ? options_.metrics : &own_metrics_),
      record_(options_.metrics != nullptr),
      labels_({{"job", options_.job_id},
               {"rank", absl::StrCat(options_.rank)},
               {"host", options_.host}}),
      executor_(options_.executor.get()),
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
  // Serialised with StopWithin: a stop that came first leaves the engine unstarted.
  absl::MutexLock join_lock(&join_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
  }
  thread_ = std::thread([this] {
    Loop();
    loop_done_.Notify();
  });
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
  if (executor_ != nullptr && !status.ok()) executor_->Abort(std::string(status.message()));
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

void Engine::Stop() { StopWithin(absl::InfiniteDuration()); }

bool Engine::StopWithin(absl::Duration timeout) {
  bool first;
  {
    absl::MutexLock lock(&mu_);
    first = !stopping_;
    stopping_ = true;
  }
  if (first) {
    Abort(absl::CancelledError(absl::StrCat("job ", options_.job_id, " stopped on ", RankName())));
  }
  absl::MutexLock join_lock(&join_mu_);
  if (!thread_.joinable()) return true;  // never started, or joined
  if (!loop_done_.WaitForNotificationWithTimeout(timeout)) return false;
  thread_.join();
  return true;
}

bool Engine::Stopping() {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

void Engine::Loop() {
  setup_status_ =
      executor_ != nullptr ? executor_->Setup() : absl::FailedPreconditionError("no executor");
  executor_ready_ = setup_status_.ok();
  if (!executor_ready_) {
    if (setup_status_.code() == absl::StatusCode::kFailedPrecondition || Stopping()) {
      // The job ended while its ranks were still meeting (a command that exits at once): its
      // rendezvous is closed, which is no error of this rank.
      spdlog::info("job {} {}: no communicator, the job ended: {}", options_.job_id, RankName(),
                   std::string(setup_status_.message()));
    } else {
      spdlog::error("job {} {}: communicator: {}", options_.job_id, RankName(),
                    setup_status_.ToString());
    }
    Abort(absl::UnavailableError(
        absl::StrCat("communicator setup failed on ", RankName(), ": ", setup_status_.message())));
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
      Clock& clock = *options_.clock;
      auto due = [this, &clock]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !unsent_.empty() && clock.Now() >= last_sent_ + cycle_time_;
      };
      auto ready = [this, had_unsent, &due]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !responses_.empty() || (!had_unsent && !unsent_.empty()) || due();
      };
      // Until the cycle ends on the engine's clock, looking at it at least every kClockPoll.
      const absl::Duration wait =
          unsent_.empty() ? kClockPoll
                          : std::min(kClockPoll, last_sent_ + cycle_time_ - clock.Now());
      mu_.AwaitWithTimeout(absl::Condition(&ready), wait);
      if (stopping_) return;
      if (due()) {
        batch.swap(unsent_);
        last_sent_ = clock.Now();
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
  b->set_cache_generation(generation_);
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

void Engine::Renegotiate(uint64_t generation) {
  cache_ = WorkerCache();
  generation_ = generation;
  absl::MutexLock lock(&mu_);
  absl::flat_hash_set<std::string> unsent;
  for (const v1::TensorRequest& r : unsent_) unsent.insert(r.name());
  // In the order the training process enqueued them.
  std::vector<const Op*> again;
  for (const auto& [name, op] : ops_) {
    if (!unsent.contains(name)) again.push_back(op.get());
  }
  std::sort(again.begin(), again.end(),
            [](const Op* a, const Op* b) { return a->enqueue.handle() < b->enqueue.handle(); });
  std::vector<v1::TensorRequest> requests;
  for (const Op* op : again) requests.push_back(op->enqueue.request());
  unsent_.insert(unsent_.begin(), requests.begin(), requests.end());
  last_sent_ = absl::InfinitePast();  // at once
  spdlog::info("job {} {}: negotiation resumed (cache generation {}); {} requests sent again",
               options_.job_id, RankName(), generation, requests.size());
}

void Engine::Process(v1::ResponseList& list, absl::Time arrived) {
  if (list.cache_generation() != generation_) Renegotiate(list.cache_generation());
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
    b->set_cache_generation(generation_);
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
    ExecutionTrace trace(options_.timeline && r.type() != v1::Response::TYPE_ERROR &&
                             r.type() != v1::Response::TYPE_JOIN,
                         arrived);
    // Waiting behind the earlier responses of the list.
    trace.End("QUEUE");
    Execute(r, names, trace);
  }
}

void Engine::SendSpan(const v1::Response& r, const std::vector<std::string>& names,
                      const ExecutionTrace& trace) {
  if (!options_.timeline || trace.ends().size() < 2) return;
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
  const int64_t offset = absl::ToInt64Microseconds(options_.wall_clock_offset);
  span->set_start_unix_us(absl::ToUnixMicros(trace.arrived()) + offset);
  for (const auto& [activity, end] : trace.ends()) {
    span->add_activities(activity);
    span->add_activity_end_unix_us(end + offset);
  }
  spans.set_sent_unix_us(absl::ToUnixMicros(absl::Now()) + offset);
  options_.send(message);
}

Collective Engine::ToCollective(const v1::Response& r, const std::vector<Op*>& ops) {
  Collective c;
  switch (r.type()) {
    case v1::Response::TYPE_ALLGATHER:
      c.type = Collective::Type::kAllgather;
      break;
    case v1::Response::TYPE_BROADCAST:
      c.type = Collective::Type::kBroadcast;
      break;
    case v1::Response::TYPE_BARRIER:
      c.type = Collective::Type::kBarrier;
      break;
    default:
      c.type = Collective::Type::kAllreduce;
      break;
  }
  c.dtype = static_cast<DataType>(r.dtype());
  c.op = static_cast<ReduceOp>(r.reduce_op());
  c.prescale = r.prescale_factor() == 0 ? 1.0 : r.prescale_factor();
  c.postscale = r.postscale_factor() == 0 ? 1.0 : r.postscale_factor();
  c.root = r.root_rank();
  c.tensors.resize(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i] == nullptr) continue;
    c.tensors[i].offset = ops[i]->enqueue.offset();
    c.tensors[i].ready_event = ops[i]->enqueue.ready_event();
    const auto& shape = ops[i]->enqueue.request().shape();
    c.tensors[i].shape.assign(shape.begin(), shape.end());
  }
  c.sizes.assign(r.tensor_sizes().begin(), r.tensor_sizes().end());
  c.row_elements.assign(r.row_elements().begin(), r.row_elements().end());
  return c;
}

void Engine::Execute(const v1::Response& r, const std::vector<std::string>& names,
                     ExecutionTrace& trace) {
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
  std::vector<v1::LocalCompletion> completions(ops.size());
  const absl::Time started = absl::Now();
  absl::Status status;
  const bool known =
      r.type() == v1::Response::TYPE_ALLREDUCE || r.type() == v1::Response::TYPE_ALLGATHER ||
      r.type() == v1::Response::TYPE_BROADCAST || r.type() == v1::Response::TYPE_BARRIER;
  if (!executor_ready_) {
    status = absl::UnavailableError(
        absl::StrCat("no communicator on ", RankName(), ": ", setup_status_.message()));
  } else if (!known) {
    status = absl::InternalError(absl::StrCat("unknown response type ", r.type()));
  } else {
    absl::StatusOr<Executed> executed = executor_->Execute(ToCollective(r, ops), trace);
    status = executed.status();
    if (executed.ok()) {
      for (size_t i = 0; i < completions.size(); ++i) {
        completions[i].set_done_event(executed->done_event);
        if (i < executed->outputs.size() && executed->outputs[i].offset >= 0) {
          completions[i].set_output_offset(executed->outputs[i].offset);
          for (int64_t d : executed->outputs[i].shape) completions[i].add_output_shape(d);
        }
      }
    }
  }
  if (status.ok()) Record(r, ops, absl::Now() - started);
  // Before completing: a rank that finishes at once and exits must not overtake its last span (the
  // job, and its timeline, would end without it).
  SendSpan(r, names, trace);
  for (size_t i = 0; i < ops.size(); ++i) Complete(ops[i], status, completions[i]);
  if (record_) {
    absl::MutexLock lock(&mu_);
    series_.queue_depth->Set(static_cast<double>(ops_.size()));
  }
  // The executor says whether the failure leaves the rank unable to go on (a Gloo communicator is
  // unusable after a failed collective; on a GPU the rank would be out of step with its peers):
  // then everything else fails too.
  if (!status.ok() && (executor_ == nullptr || !executor_ready_ || executor_->Fatal(status))) {
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

}  // namespace ringmaster
