#include "worker/negotiation/engine.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/tensor.h"
#include "spdlog/spdlog.h"
#include "worker/execution_clocks.h"

namespace ringmaster {
namespace {

int64_t ByteSize(const TensorRequest& r) {
  int64_t n = DataTypeSize(r.dtype);
  for (int64_t d : r.shape) n *= d;
  return n;
}

OpResult Failed(const absl::Status& status) {
  OpResult result;
  result.status = status;
  return result;
}

}  // namespace

Engine::Engine(EngineOptions options)
    : options_(std::move(options)),
      metrics_(options_.metrics, options_.job_id, options_.rank, options_.host, options_.size),
      executor_(options_.executor.get()),
      cycle_time_(options_.cycle_time) {}

Engine::~Engine() { Stop(); }

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

void Engine::Enqueue(LocalOp local, Done done) {
  const TensorRequest& r = local.request;
  auto reject = [&](absl::Status status) { done(Failed(status)); };
  if (r.name.empty()) return reject(absl::InvalidArgumentError("tensor name is empty"));
  const bool has_data = r.type == RequestType::kAllreduce || r.type == RequestType::kAllgather ||
                        r.type == RequestType::kBroadcast;
  if (local.address != 0 && (r.type != RequestType::kAllreduce || local.pid <= 0)) {
    return reject(absl::InvalidArgumentError(
        absl::StrCat("tensor '", r.name, "': only an allreduce of a process with direct access ",
                     "may name its tensor by address")));
  }
  // A tensor reduced where it lives is still bounded as one staged would be: the daemon's fusion
  // buffer holds it whole.
  if (local.address != 0 && (ByteSize(r) < 0 || static_cast<uint64_t>(ByteSize(r)) >
                                                    static_cast<uint64_t>(options_.arena_bytes))) {
    return reject(absl::ResourceExhaustedError(absl::StrCat(
        "tensor '", r.name, "': ", ByteSize(r), " bytes is more than the ", options_.arena_bytes,
        "-byte arena this worker reduces at once: start the workers with a larger --arena-mb "
        "(ringmaster local --arena-mb)")));
  }
  if (has_data && local.address == 0) {
    const int64_t bytes = ByteSize(r);
    if (local.offset < 0 || bytes < 0 ||
        static_cast<uint64_t>(local.offset) + static_cast<uint64_t>(bytes) > options_.arena_bytes) {
      return reject(absl::InvalidArgumentError(
          absl::StrCat("tensor '", r.name, "': ", bytes, " bytes at arena offset ", local.offset,
                       " lie outside the ", options_.arena_bytes, "-byte arena")));
    }
  }
  absl::Status rejected;
  bool queued = false;
  {
    absl::MutexLock lock(&mu_);
    if (!aborted_.ok()) {
      rejected = aborted_;
    } else if (ops_.size() >= options_.max_in_flight) {
      rejected = absl::ResourceExhaustedError(absl::StrCat(
          "tensor '", r.name, "': ", RankName(), " has ", ops_.size(),
          " operations in flight, the most a training process may have at once: wait for some "
          "(synchronize) before enqueueing more"));
    } else if (ops_.contains(r.name)) {
      rejected = absl::InvalidArgumentError(
          absl::StrCat("Tensor '", r.name, "' is already in flight on ", RankName(),
                       ": wait for it to complete before submitting it again, or use a different "
                       "name."));
    } else {
      if (r.type == RequestType::kJoin) joined_ = true;
      unsent_.push_back(r);
      std::string name = r.name;
      ops_[std::move(name)] = std::make_unique<Op>(Op{std::move(local), std::move(done)});
      metrics_.QueueDepth(ops_.size());
      queued = true;
    }
  }
  if (queued) {
    WakeRound();  // a local round in progress gives up: there is more to negotiate
    return;
  }
  reject(rejected);  // outside the lock: the reply is a socket write
}

void Engine::OnResponses(RankCycle cycle) {
  const absl::Time now = options_.timeline ? absl::Now() : absl::InfinitePast();
  {
    absl::MutexLock lock(&mu_);
    responses_.push_back({std::move(cycle), now});
  }
  WakeRound();
}

void Engine::WakeRound() {
  if (in_round_.load()) rounds_->Wake();
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
  WakeRound();
  for (auto& [name, op] : ops) op->done(Failed(status));
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
  rounds_ = executor_ready_ ? executor_->local_rounds() : nullptr;
  absl::Cleanup report = [this] {
    if (rounds_ == nullptr) return;
    spdlog::info(
        "job {} {}: {} allreduces negotiated locally, {} local rounds diverted to the "
        "coordinator",
        options_.job_id, RankName(), rounds_completed_, rounds_diverted_);
  };
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
    std::vector<TensorRequest> batch;
    std::deque<Arrived> lists;
    bool lone = false;  // the rank's only collective in flight, and no list to process
    {
      absl::MutexLock lock(&mu_);
      // Wake for responses at once. Requests go out at most once per cycle: at once when the last
      // batch left a cycle ago or more, or when nothing sent is still awaiting its response (a
      // lone small collective, or the first of a step, does not wait out a cycle for tensors to
      // fuse with: none are on their way), else when that cycle ends (so tensors enqueued
      // meanwhile travel, and can be fused, together).
      const bool had_unsent = !unsent_.empty();
      Clock& clock = *options_.clock;
      auto due = [this, &clock]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !unsent_.empty() &&
               (ops_.size() <= unsent_.size() || clock.Now() >= last_sent_ + cycle_time_);
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
        lone = rounds_ != nullptr && batch.size() == 1 && ops_.size() == 1 && responses_.empty() &&
               !joined_;
      }
      lists.swap(responses_);
    }
    if (!batch.empty() && !(lone && TryLocalRound(batch.front()))) SendBatch(batch);
    for (Arrived& a : lists) Process(a.cycle, a.time);
  }
}

RequestBatch Engine::NewBatch() const {
  RequestBatch b;
  b.job_id = options_.job_id;
  b.epoch = options_.epoch;
  b.rank = options_.rank;
  b.cache_generation = generation_;
  return b;
}

void Engine::SendBatch(const std::vector<TensorRequest>& requests) {
  RequestBatch b = NewBatch();
  for (const TensorRequest& r : requests) {
    if (uint32_t id = cache_.Find(r); id != 0) {
      b.cached_ids.push_back(id);
    } else {
      b.requests.push_back(r);
    }
  }
  SendToCoordinator(std::move(b));
}

void Engine::SendToCoordinator(RequestBatch batch) {
  // First, so that a rank waiting in a round here gives up before this batch is on its way.
  if (rounds_ != nullptr) rounds_->Divert(Point());
  batch.used_ids.swap(used_ids_);
  used_ids_.clear();
  options_.send_requests(batch);
}

bool Engine::TryLocalRound(const TensorRequest& request) {
  // An automatic name is new every call: its family's cache entry stands for it (the ranks' lone
  // collectives at one point are matched by position, the round checks that they agree on it).
  uint32_t id = cache_.Find(request);
  if (id == 0) id = cache_.FindFamily(request);
  if (id == 0 || id > LocalRounds::kMaxId || request.type != RequestType::kAllreduce ||
      request.process_set_id != 0 || request.group_id != 0 || request.device != -1) {
    return false;
  }
  const absl::Time posted = absl::Now();
  absl::Duration patience;
  {
    absl::MutexLock lock(&mu_);
    // Long enough for ranks running in step; a rank far behind finds the round diverted and goes
    // to the coordinator too (whose stall inspector then watches the collective).
    patience = std::clamp(4 * cycle_time_, absl::Milliseconds(1), absl::Milliseconds(50));
  }
  in_round_.store(true);
  const LocalRounds::Outcome outcome =
      rounds_->Join(Point(), id, posted + patience, [this]() ABSL_LOCKS_EXCLUDED(mu_) {
        absl::MutexLock lock(&mu_);
        return stopping_ || !aborted_.ok() || !responses_.empty() || ops_.size() > 1;
      });
  in_round_.store(false);
  if (outcome == LocalRounds::Outcome::kDiverted) {
    ++rounds_diverted_;
    metrics_.LocalRound(/*completed=*/false);
    return false;
  }
  ++rounds_completed_;
  metrics_.LocalRound(/*completed=*/true);
  // The coordinator hears of the use with this rank's next batch, so that its cache keeps the
  // entry.
  if (used_ids_.size() < kMaxUsedIds &&
      std::find(used_ids_.begin(), used_ids_.end(), id) == used_ids_.end()) {
    used_ids_.push_back(id);
  }
  {
    // Aborted meanwhile: the executor's abort fails the collective on every rank.
    absl::MutexLock lock(&mu_);
    if (!ops_.contains(request.name)) return true;
  }
  // What the coordinator would have answered: the cached request, normalised as it does.
  Response r;
  r.type = Response::Type::kAllreduce;
  r.names = {request.name};
  r.cache_ids = {id};
  r.dtype = request.dtype;
  r.reduce_op =
      request.reduce_op == ReduceOp::kUnspecified ? ReduceOp::kAverage : request.reduce_op;
  r.prescale_factor = request.prescale_factor == 0 ? 1.0 : request.prescale_factor;
  r.postscale_factor = request.postscale_factor == 0 ? 1.0 : request.postscale_factor;
  r.root_rank = request.root_rank;
  r.device = request.device;
  r.tensor_sizes = {NumElements(request.shape)};
  ExecutionTrace trace(options_.timeline, posted);
  trace.End("LOCAL_NEGOTIATE");
  Execute(r, r.names, trace);
  return true;
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

void Engine::Complete(Op* op, const absl::Status& status, OpResult result) {
  if (op == nullptr) return;
  if (!status.ok()) {
    result = Failed(status);
    metrics_.Error(status.code() == absl::StatusCode::kFailedPrecondition ? "negotiation"
                   : status.code() == absl::StatusCode::kUnavailable      ? "peer"
                   : status.code() == absl::StatusCode::kAborted          ? "job_stopped"
                                                                          : "other");
  }
  op->done(result);
  delete op;
}

void Engine::Renegotiate(uint64_t generation) {
  cache_ = WorkerCache();
  used_ids_.clear();  // the old generation's ids
  generation_ = generation;
  absl::MutexLock lock(&mu_);
  absl::flat_hash_set<std::string> unsent;
  for (const TensorRequest& r : unsent_) unsent.insert(r.name);
  // In the order the training process enqueued them.
  std::vector<const Op*> again;
  for (const auto& [name, op] : ops_) {
    if (!unsent.contains(name)) again.push_back(op.get());
  }
  std::sort(again.begin(), again.end(),
            [](const Op* a, const Op* b) { return a->local.handle < b->local.handle; });
  std::vector<TensorRequest> requests;
  for (const Op* op : again) requests.push_back(op->local.request);
  unsent_.insert(unsent_.begin(), requests.begin(), requests.end());
  last_sent_ = absl::InfinitePast();  // at once
  spdlog::info("job {} {}: negotiation resumed (cache generation {}); {} requests sent again",
               options_.job_id, RankName(), generation, requests.size());
}

void Engine::Process(RankCycle& cycle, absl::Time arrived) {
  if (cycle.cache_generation != generation_) Renegotiate(cycle.cache_generation);
  fusion_threshold_ = cycle.fusion_threshold_bytes;
  if (cycle.cycle_time_ms > 0) {
    absl::MutexLock lock(&mu_);
    cycle_time_ = absl::Microseconds(static_cast<int64_t>(cycle.cycle_time_ms * 1000));
  }
  {
    absl::MutexLock lock(&mu_);
    for (uint32_t id : cycle.evicted_ids) {
      const std::string* name = cache_.NameOf(id);
      cache_.Evict(id, name != nullptr && ops_.contains(*name));
    }
    for (const CacheAssignment& a : cycle.cache_assignments) {
      if (auto it = ops_.find(a.name); it != ops_.end()) {
        cache_.Assign(a.name, a.id, it->second->local.request);
      }
    }
  }
  if (!cycle.resend_ids.empty()) {
    RequestBatch b = NewBatch();
    for (uint32_t id : cycle.resend_ids) {
      if (std::optional<TensorRequest> r = cache_.TakeForResend(id)) {
        b.requests.push_back(*std::move(r));
      }
    }
    SendToCoordinator(std::move(b));
  }
  for (const Response& e : cycle.rank_errors) {
    for (Op* op : Take(e.names)) {
      Complete(op, absl::FailedPreconditionError(e.error_message));
    }
  }
  for (const Response& r : cycle.responses) {
    // A process set's collective is its members' alone.
    if (!r.process_set_ranks.empty() &&
        !std::binary_search(r.process_set_ranks.begin(), r.process_set_ranks.end(),
                            options_.rank)) {
      continue;
    }
    const size_t n = std::max(r.names.size(), r.cache_ids.size());
    std::vector<std::string> names(n);
    for (size_t i = 0; i < n; ++i) {
      if (i < r.names.size() && !r.names[i].empty()) {
        names[i] = r.names[i];
      } else if (i < r.cache_ids.size()) {
        if (const std::string* name = cache_.NameOf(r.cache_ids[i])) names[i] = *name;
      }
    }
    ExecutionTrace trace(
        options_.timeline && r.type != Response::Type::kError && r.type != Response::Type::kJoin,
        arrived);
    // Waiting behind the earlier responses of the list.
    trace.End("QUEUE");
    Execute(r, names, trace);
  }
  ++lists_processed_;
  if (rounds_ != nullptr) {
    // Requests still awaiting a response at the new point: rounds there cannot complete (those
    // requests need the other ranks' too, at the coordinator).
    bool awaiting;
    {
      absl::MutexLock lock(&mu_);
      awaiting = ops_.size() > unsent_.size();
    }
    if (awaiting) rounds_->Divert(Point());
  }
}

void Engine::SendSpan(const Response& r, const std::vector<std::string>& names,
                      const ExecutionTrace& trace) {
  if (!options_.timeline || trace.ends().size() < 2) return;
  ExecutionSpan span;
  for (const std::string& name : names) {
    if (!name.empty()) span.tensors.push_back(name);
  }
  if (span.tensors.empty()) return;
  const char* ops[] = {"ALLREDUCE", "ALLGATHER", "BROADCAST", "JOIN", "BARRIER", "ERROR"};
  const int type = static_cast<int>(r.type);
  span.op = type >= 0 && type < 6 ? ops[type] : "";
  const int64_t offset = absl::ToInt64Microseconds(options_.wall_clock_offset);
  span.start_unix_us = absl::ToUnixMicros(trace.arrived()) + offset;
  for (const auto& [activity, end] : trace.ends()) {
    span.activities.emplace_back(activity, end + offset);
  }
  options_.send_span(span, absl::ToUnixMicros(absl::Now()) + offset);
}

Collective Engine::ToCollective(const Response& r, const std::vector<Op*>& ops) {
  Collective c;
  switch (r.type) {
    case Response::Type::kAllgather:
      c.type = Collective::Type::kAllgather;
      break;
    case Response::Type::kBroadcast:
      c.type = Collective::Type::kBroadcast;
      break;
    case Response::Type::kBarrier:
      c.type = Collective::Type::kBarrier;
      break;
    default:
      c.type = Collective::Type::kAllreduce;
      break;
  }
  c.dtype = r.dtype;
  c.op = r.reduce_op;
  c.prescale = r.prescale_factor == 0 ? 1.0 : r.prescale_factor;
  c.postscale = r.postscale_factor == 0 ? 1.0 : r.postscale_factor;
  c.root = r.root_rank;
  c.tensors.resize(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i] == nullptr) continue;
    c.tensors[i].offset = ops[i]->local.offset;
    c.tensors[i].address = ops[i]->local.address;
    c.tensors[i].pid = ops[i]->local.pid;
    c.tensors[i].ready_event = ops[i]->local.ready_event;
    c.tensors[i].shape = ops[i]->local.request.shape;
  }
  c.sizes = r.tensor_sizes;
  c.row_elements = r.row_elements;
  c.process_set_id = r.process_set_id;
  c.process_set_ranks = r.process_set_ranks;
  return c;
}

void Engine::Execute(const Response& r, const std::vector<std::string>& names,
                     ExecutionTrace& trace) {
  if (r.type == Response::Type::kJoin) {
    {
      absl::MutexLock lock(&mu_);
      joined_ = false;
    }
    std::vector<std::string> join_names;
    {
      absl::MutexLock lock(&mu_);
      for (auto& [name, op] : ops_) {
        if (op->local.request.type == RequestType::kJoin) join_names.push_back(name);
      }
    }
    OpResult joined;
    joined.last_joined_rank = r.last_joined_rank;
    for (Op* op : Take(join_names)) Complete(op, absl::OkStatus(), joined);
    return;
  }
  std::vector<Op*> ops = Take(names);
  if (r.type == Response::Type::kError) {
    for (Op* op : ops) Complete(op, absl::FailedPreconditionError(r.error_message));
    return;
  }
  std::vector<OpResult> results(ops.size());
  const absl::Time started = absl::Now();
  absl::Status status;
  const bool known = r.type == Response::Type::kAllreduce || r.type == Response::Type::kAllgather ||
                     r.type == Response::Type::kBroadcast || r.type == Response::Type::kBarrier;
  if (!executor_ready_) {
    status = absl::UnavailableError(
        absl::StrCat("no communicator on ", RankName(), ": ", setup_status_.message()));
  } else if (!known) {
    // Named by its wire number (Response.Type).
    status =
        absl::InternalError(absl::StrCat("unknown response type ", static_cast<int>(r.type) + 1));
  } else {
    absl::StatusOr<Executed> executed = executor_->Execute(ToCollective(r, ops), trace);
    status = executed.status();
    if (executed.ok()) {
      for (size_t i = 0; i < results.size(); ++i) {
        results[i].done_event = executed->done_event;
        if (i < executed->outputs.size() && executed->outputs[i].offset >= 0) {
          results[i].output_offset = executed->outputs[i].offset;
          results[i].output_shape = std::move(executed->outputs[i].shape);
        }
      }
    }
  }
  const absl::Duration took = absl::Now() - started;
  if (status.ok()) Record(r, ops, took);
  if (options_.clocks != nullptr && executor_ready_ && known) options_.clocks->Executed(took);
  // Horovod's remove_process_set: a barrier of every rank, after which the set's communicators go.
  int32_t released = 0;
  if (status.ok() && r.type == Response::Type::kBarrier && r.process_set_ranks.empty() &&
      names.size() == 1 && absl::StartsWith(names[0], kReleaseProcessSetPrefix) &&
      absl::SimpleAtoi(absl::string_view(names[0]).substr(sizeof(kReleaseProcessSetPrefix) - 1),
                       &released) &&
      released > 0) {
    executor_->ReleaseProcessSet(released);
  }
  // Before completing: a rank that finishes at once and exits must not overtake its last span (the
  // job, and its timeline, would end without it).
  SendSpan(r, names, trace);
  for (size_t i = 0; i < ops.size(); ++i) Complete(ops[i], status, std::move(results[i]));
  {
    absl::MutexLock lock(&mu_);
    metrics_.QueueDepth(ops_.size());
  }
  // The executor says whether the failure leaves the rank unable to go on (a Gloo communicator is
  // unusable after a failed collective; on a GPU the rank would be out of step with its peers):
  // then everything else fails too.
  // A response of a type this worker does not know (a newer coordinator) reached no communicator:
  // it fails alone, as on every rank.
  if (!status.ok() &&
      (executor_ == nullptr || !executor_ready_ || (known && executor_->Fatal(status)))) {
    Abort(status);
  }
}

void Engine::Record(const Response& r, const std::vector<Op*>& ops, absl::Duration took) {
  int64_t bytes = 0;
  if (r.type == Response::Type::kAllgather) {
    for (Op* op : ops) {
      if (op != nullptr) bytes += ByteSize(op->local.request);
    }
  } else {
    for (int64_t n : r.tensor_sizes) bytes += n * DataTypeSize(r.dtype);
  }
  metrics_.Executed(r.type, bytes, ops.size(), took, fusion_threshold_);
}

}  // namespace ringmaster
