#include "coordinator/job_runtime.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <map>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/relay_plan.h"
#include "coordinator/median.h"
#include "spdlog/spdlog.h"

namespace ringmaster {
namespace {

NegotiatorOptions NegotiatorOptionsFor(const Job& job) {
  NegotiatorOptions o;
  o.job_id = job.id;
  for (const RankInfo& r : job.ranks) o.rank_hosts.push_back(r.host);
  const Knobs& k = job.spec.knobs;
  o.fusion_threshold_bytes = k.fusion_threshold_bytes;
  o.cycle_time = absl::Microseconds(static_cast<int64_t>(k.cycle_time_ms * 1000));
  o.cache_capacity = k.cache_capacity;
  o.stall_check = absl::Milliseconds(static_cast<int64_t>(k.stall_check_seconds * 1000));
  o.stall_shutdown = absl::Milliseconds(static_cast<int64_t>(k.stall_shutdown_seconds * 1000));
  o.record_timeline = !k.timeline.empty();
  return o;
}

bool Fixed(const Knobs& k, absl::string_view knob) {
  return std::find(k.autotune_fixed.begin(), k.autotune_fixed.end(), knob) !=
         k.autotune_fixed.end();
}

std::vector<int32_t> RelayOfRanks(const Job& job) {
  std::vector<RelayMember> ranks;
  ranks.reserve(job.ranks.size());
  for (const RankInfo& r : job.ranks) ranks.push_back({r.host, r.worker_identity});
  return PlanRelays(ranks, job.spec.knobs.negotiation_relay_hosts);
}

// Each rank's host as an index (ranks on one host share it), in rank order.
std::vector<int> HostIndexOfRanks(const Job& job) {
  absl::flat_hash_map<std::string, int> index;
  std::vector<int> out;
  out.reserve(job.ranks.size());
  for (const RankInfo& r : job.ranks) {
    out.push_back(index.try_emplace(r.host, static_cast<int>(index.size())).first->second);
  }
  return out;
}

absl::flat_hash_map<std::string, int32_t> RankOfWorkers(const Job& job) {
  absl::flat_hash_map<std::string, int32_t> out;
  for (const RankInfo& r : job.ranks) out.emplace(r.worker_id, r.rank);
  return out;
}

// Autotune turns a disabled cache on with Horovod's default capacity.
constexpr int kDefaultCacheCapacity = 1024;

}  // namespace

JobRuntime::JobRuntime(const Job& job, MetricsRegistry& metrics, Executor& io)
    : job_id_(job.id),
      straggler_action_(job.spec.knobs.straggler_action),
      epoch_(job.epoch),
      ranks_(job.ranks),
      relay_of_(RelayOfRanks(job)),
      rank_of_worker_(RankOfWorkers(job)),
      io_(io),
      cycles_(&metrics.GetCounter("ringmaster_negotiation_cycles_total",
                                  "Negotiation cycles that produced responses.",
                                  {{"job", job.id}})),
      tensors_(&metrics.GetCounter("ringmaster_tensors_negotiated_total",
                                   "Tensors that left the negotiator in a response.",
                                   {{"job", job.id}})),
      cache_hits_(&metrics.GetCounter("ringmaster_response_cache_hits_total",
                                      "Ready tensors requested by response-cache id.",
                                      {{"job", job.id}})),
      cache_misses_(&metrics.GetCounter("ringmaster_response_cache_misses_total",
                                        "Ready tensors requested in full.", {{"job", job.id}})),
      latency_(&metrics.GetHistogram(
          "ringmaster_negotiation_latency_seconds",
          "From the first request of a tensor in a cycle to the cycle's response.",
          ExponentialBuckets(0.0001, 2, 16), {{"job", job.id}})),
      stalled_(&metrics.GetGauge(
          "ringmaster_stalled_tensors",
          "Tensors submitted by some ranks and waiting for the others longer than the stall-check "
          "time.",
          {{"job", job.id}})),
      metrics_(metrics),
      execution_({.ranks = static_cast<int>(job.ranks.size()), .hosts = HostIndexOfRanks(job)}) {
  absl::MutexLock lock(&mu_);
  acked_cycles_.assign(ranks_.size(), 0);
  last_request_.assign(ranks_.size(), 0);
}

JobRuntime::~JobRuntime() { Close(); }

std::shared_ptr<JobRuntime> JobRuntime::Open(const Job& job, const ArtifactStore& artifacts,
                                             MetricsRegistry& metrics, Executor& io, absl::Time now,
                                             std::vector<std::string>* problems, bool restored) {
  auto runtime = std::shared_ptr<JobRuntime>(new JobRuntime(job, metrics, io));
  const Knobs& k = job.spec.knobs;
  NegotiatorOptions options = NegotiatorOptionsFor(job);
  const bool tune_cache = k.autotune && !Fixed(k, "cache_capacity");
  if (tune_cache && options.cache_capacity == 0) options.cache_capacity = kDefaultCacheCapacity;
  runtime->negotiator_ = std::make_unique<Negotiator>(std::move(options));
  if (k.cache_capacity == 0) runtime->negotiator_->SetCacheEnabled(false);
  // Always: a job id reused by a later coordinator run must not show the earlier job's files. A
  // restored job keeps its own.
  if (!restored) {
    if (absl::Status s = artifacts.Reset(job.id); !s.ok()) problems->emplace_back(s.message());
  }
  if (!k.timeline.empty() && restored) {
    problems->push_back(
        job.resets > 0 ? absl::StrCat("the timeline ", k.timeline, " ends where epoch ", job.epoch,
                                      " began (an elastic job's timeline covers its first epoch)")
                       : absl::StrCat("the timeline ", k.timeline,
                                      " ends where the coordinator restarted (it is not resumed)"));
  } else if (!k.timeline.empty()) {
    absl::StatusOr<std::unique_ptr<ringmaster::Timeline>> timeline =
        ringmaster::Timeline::Create(artifacts.PathOf(job.id, k.timeline),
                                     absl::StrCat("job ", job.id), k.timeline_mark_cycles, now);
    if (timeline.ok()) {
      runtime->timeline_ = *std::move(timeline);
      runtime->timeline_name_ = k.timeline;
    } else {
      problems->push_back(absl::StrCat("no timeline: ", timeline.status().message()));
    }
  }
  if (!k.autotune) return runtime;
  AutotuneOptions a;
  a.warmup_samples = k.autotune_warmup_samples;
  a.steps_per_sample = k.autotune_steps_per_sample;
  a.max_samples = k.autotune_bayes_opt_max_samples;
  a.noise = k.autotune_gaussian_process_noise;
  a.start = {k.fusion_threshold_bytes, k.cycle_time_ms, k.cache_capacity > 0};
  a.tune_fusion_threshold = !Fixed(k, "fusion_threshold_bytes");
  a.tune_cycle_time = !Fixed(k, "cycle_time_ms");
  a.hierarchical_allreduce = k.hierarchical_allreduce;
  a.hierarchical_allgather = k.hierarchical_allgather;
  a.tune_cache = tune_cache;
  std::vector<std::string> header;
  {
    absl::MutexLock lock(&runtime->mu_);
    runtime->autotuner_ = std::make_unique<Autotuner>(a);
    // The first sample starts with the job's first negotiation cycle (not now, at scheduling,
    // which would count process start-up against the starting setting).
    header = runtime->autotuner_->TakeLog();
  }
  if (k.autotune_log.empty()) return runtime;
  const std::string path = artifacts.PathOf(job.id, k.autotune_log);
  absl::MutexLock lock(&runtime->log_mu_);
  runtime->autotune_log_.reset(std::fopen(path.c_str(), restored ? "ae" : "we"));
  if (runtime->autotune_log_ == nullptr) {
    problems->push_back(
        absl::StrCat("cannot create autotune log ", path, ": ", std::strerror(errno)));
  }
  runtime->WriteAutotuneLog(header);
  return runtime;
}

bool JobRuntime::Accept(int32_t rank, uint64_t seq, uint64_t ack_responses,
                        uint64_t cache_generation) {
  absl::MutexLock lock(&mu_);
  const size_t r = static_cast<size_t>(rank);
  if (r >= last_request_.size()) return false;
  if (ack_responses > acked_cycles_[r]) {
    acked_cycles_[r] = std::min(ack_responses, last_cycle_);
    ForgetAcknowledged();
  }
  if (restoring_ || cache_generation != generation_) {
    // Encoded for a cache the coordinator no longer has (or not yet negotiable): the worker
    // sends its requests again in the new generation.
    last_request_[r] = std::max(last_request_[r], seq);
    return false;
  }
  if (seq != 0) {
    if (seq <= last_request_[r]) return false;  // a re-sent batch we have
    if (seq != last_request_[r] + 1) {
      spdlog::warn("job {} rank {}: request batch {} follows batch {}: batches between were lost",
                   job_id_, rank, seq, last_request_[r]);
    }
    last_request_[r] = seq;
  }
  return true;
}

bool JobRuntime::Submit(int32_t rank, std::vector<TensorRequest> requests,
                        const std::vector<uint32_t>& cached_ids, absl::Time now, uint64_t seq,
                        uint64_t ack_responses, uint64_t cache_generation,
                        const std::vector<uint32_t>& used_ids) {
  absl::MutexLock submit_lock(&submit_mu_);
  if (!Accept(rank, seq, ack_responses, cache_generation)) return false;
  // Before the requests: an entry used locally since the last batch must not be evicted by a
  // tensor this batch completes.
  if (!used_ids.empty()) negotiator_->Touch(used_ids);
  negotiator_->Submit(rank, std::move(requests), cached_ids, now);
  return true;
}

std::vector<char> JobRuntime::SubmitRelayed(std::vector<RequestBatch>& batches,
                                            absl::Span<const uint32_t> shared_cached_ids,
                                            absl::Time now) {
  absl::MutexLock submit_lock(&submit_mu_);
  std::vector<char> taken(batches.size(), 0);
  std::vector<int32_t> ranks;
  for (size_t i = 0; i < batches.size(); ++i) {
    const RequestBatch& b = batches[i];
    taken[i] = Accept(b.rank, b.seq, b.ack_responses, b.cache_generation);
    if (taken[i]) ranks.push_back(b.rank);
    if (taken[i] && !b.used_ids.empty()) negotiator_->Touch(b.used_ids);
  }
  // The shared ids are each batch's first requests by id, as the relay took them out of its
  // cached_ids: ahead of the batch's full requests (a join among them, which makes every later
  // request of its rank an error).
  if (!ranks.empty() && !shared_cached_ids.empty()) {
    negotiator_->SubmitShared(ranks, shared_cached_ids, now);
  }
  for (size_t i = 0; i < batches.size(); ++i) {
    if (!taken[i]) continue;
    RequestBatch& b = batches[i];
    negotiator_->Submit(b.rank, std::move(b.requests), b.cached_ids, now);
  }
  return taken;
}

void JobRuntime::RouteVia(int32_t rank, const std::string& relay) {
  absl::MutexLock lock(&routes_mu_);
  const size_t r = static_cast<size_t>(rank);
  if (via_.empty()) {
    via_.resize(ranks_.size());
    direct_.resize(ranks_.size());
  }
  if (r >= via_.size() || direct_[r] || via_[r] == relay) return;
  via_[r] = relay;
  relayed_.store(true, std::memory_order_release);
}

void JobRuntime::RouteDirect(int32_t rank) {
  absl::MutexLock lock(&routes_mu_);
  const size_t r = static_cast<size_t>(rank);
  if (via_.empty()) {
    via_.resize(ranks_.size());
    direct_.resize(ranks_.size());
  }
  if (r >= via_.size()) return;
  via_[r].clear();
  direct_[r] = true;
}

void JobRuntime::ForEachRelayed(
    absl::FunctionRef<void(int32_t rank, const std::string& relay)> each) const {
  absl::MutexLock lock(&routes_mu_);
  for (size_t r = 0; r < via_.size(); ++r) {
    if (!via_[r].empty()) each(static_cast<int32_t>(r), via_[r]);
  }
}

uint64_t JobRuntime::LastRequestSeq(int32_t rank) const {
  absl::MutexLock lock(&mu_);
  const size_t r = static_cast<size_t>(rank);
  return r < last_request_.size() ? last_request_[r] : 0;
}

void JobRuntime::ForgetAcknowledged() {
  const uint64_t everyone = *std::min_element(acked_cycles_.begin(), acked_cycles_.end());
  while (!kept_.empty() && kept_.front()->seq <= everyone) kept_.pop_front();
}

absl::Status JobRuntime::Resend(
    int32_t rank, uint64_t after,
    absl::FunctionRef<void(const std::shared_ptr<CycleBroadcast>&)> deliver) {
  absl::MutexLock lock(&mu_);
  const size_t r = static_cast<size_t>(rank);
  if (r >= acked_cycles_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is not a rank of ", job_id_));
  }
  if (after < dropped_through_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank, " of job ", job_id_, " reconnected having received response list ", after,
        " of ", last_cycle_, ", but lists up to ", dropped_through_, " are no longer kept (",
        kKeptCycles, " are)"));
  }
  acked_cycles_[r] = std::max(acked_cycles_[r], std::min(after, last_cycle_));
  for (const std::shared_ptr<CycleBroadcast>& cycle : kept_) {
    if (cycle->seq > after) deliver(cycle);
  }
  ForgetAcknowledged();
  return absl::OkStatus();
}

std::optional<absl::Time> JobRuntime::TakeFirstCycleAfterRestore() {
  if (first_cycle_taken_.exchange(true, std::memory_order_relaxed)) return std::nullopt;
  absl::MutexLock lock(&mu_);
  std::optional<absl::Time> out;
  out.swap(first_cycle_);
  return out;
}

void JobRuntime::BeginRestore(uint64_t generation) {
  absl::MutexLock lock(&mu_);
  restoring_ = true;
  generation_ = generation;
  gathered_.assign(ranks_.size(), std::nullopt);
}

bool JobRuntime::restoring() const {
  absl::MutexLock lock(&mu_);
  return restoring_;
}

uint64_t JobRuntime::cache_generation() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

void JobRuntime::Gather(int32_t rank, uint64_t last_response_seq, uint64_t last_request_seq,
                        std::vector<std::shared_ptr<CycleBroadcast>> retained) {
  absl::MutexLock lock(&mu_);
  const size_t r = static_cast<size_t>(rank);
  if (!restoring_ || r >= gathered_.size()) return;
  gathered_[r] = Gathered{last_response_seq, last_request_seq, std::move(retained)};
}

void JobRuntime::Absent(int32_t rank) {
  absl::MutexLock lock(&mu_);
  const size_t r = static_cast<size_t>(rank);
  if (!restoring_ || r >= gathered_.size()) return;
  Gathered absent;
  absent.absent = true;
  gathered_[r] = std::move(absent);
}

std::vector<int32_t> JobRuntime::Ungathered() const {
  absl::MutexLock lock(&mu_);
  std::vector<int32_t> out;
  if (!restoring_) return out;
  for (size_t r = 0; r < gathered_.size(); ++r) {
    if (!gathered_[r].has_value()) out.push_back(static_cast<int32_t>(r));
  }
  return out;
}

absl::StatusOr<bool> JobRuntime::EndRestore(
    absl::FunctionRef<void(int32_t, const std::shared_ptr<CycleBroadcast>&)> deliver,
    absl::FunctionRef<void(int32_t, uint64_t)> resumed) {
  absl::MutexLock submit_lock(&submit_mu_);
  absl::MutexLock lock(&mu_);
  if (!restoring_) return false;
  // The last list any rank applied, the earliest one some rank lacks, and every list retained.
  uint64_t top = 0;
  uint64_t bottom = std::numeric_limits<uint64_t>::max();
  std::map<uint64_t, std::shared_ptr<CycleBroadcast>> lists;
  auto holds = [this](size_t r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return gathered_[r].has_value() && !gathered_[r]->absent;
  };
  for (const std::optional<Gathered>& g : gathered_) {
    if (!g.has_value() || g->absent) continue;
    top = std::max(top, g->last_response_seq);
    bottom = std::min(bottom, g->last_response_seq);
    for (const std::shared_ptr<CycleBroadcast>& cycle : g->retained) {
      lists.try_emplace(cycle->seq, cycle);
    }
  }
  if (bottom > top) bottom = top;  // no rank gathered
  for (size_t r = 0; r < gathered_.size(); ++r) {
    if (!holds(r)) continue;
    if (top - gathered_[r]->last_response_seq > kKeptCycles) {
      restoring_ = false;
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", r, " had received response list ", gathered_[r]->last_response_seq,
                       " when the coordinator restarted, other ranks list ", top, ": more than ",
                       kKeptCycles, " behind, the job cannot resume"));
    }
    for (uint64_t seq = gathered_[r]->last_response_seq + 1; seq <= top; ++seq) {
      if (!lists.contains(seq)) {
        restoring_ = false;
        return absl::FailedPreconditionError(absl::StrCat(
            "rank ", r, " had received response list ", gathered_[r]->last_response_seq,
            " when the coordinator restarted, other ranks list ", top, ", and no rank kept list ",
            seq, ": the job cannot resume"));
      }
    }
  }
  kept_.clear();
  for (auto& [seq, cycle] : lists) {
    if (seq > bottom && seq <= top) kept_.push_back(cycle);
  }
  // The first list of the new generation: every rank forgets its cache and asks again.
  auto first = std::make_shared<CycleBroadcast>();
  first->job_id = job_id_;
  first->output.notices.resize(ranks_.size());
  first->fusion_threshold_bytes = negotiator_->fusion_threshold_bytes();
  first->cycle_time_ms = absl::ToDoubleMilliseconds(negotiator_->cycle_time());
  first->seq = top + 1;
  first->cache_generation = generation_;
  kept_.push_back(first);
  last_cycle_ = first->seq;
  dropped_through_ = bottom;
  for (size_t r = 0; r < gathered_.size(); ++r) {
    // A rank not heard from (it exited) needs nothing.
    acked_cycles_[r] = holds(r) ? gathered_[r]->last_response_seq : last_cycle_;
    if (holds(r)) {
      last_request_[r] = std::max(last_request_[r], gathered_[r]->last_request_seq);
    }
  }
  restoring_ = false;
  awaiting_first_cycle_ = true;
  for (size_t r = 0; r < gathered_.size(); ++r) {
    if (!holds(r)) continue;
    for (const std::shared_ptr<CycleBroadcast>& cycle : kept_) {
      if (cycle->seq > gathered_[r]->last_response_seq) deliver(static_cast<int32_t>(r), cycle);
    }
    resumed(static_cast<int32_t>(r), last_request_[r]);
  }
  gathered_.clear();
  return true;
}

void JobRuntime::Flush(absl::Time now,
                       absl::FunctionRef<void(const std::shared_ptr<CycleBroadcast>&)> deliver) {
  std::vector<std::string> log_lines;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    std::optional<CycleOutput> output = negotiator_->Poll(now);
    if (!output) return;
    if (output->oldest_submit != absl::InfiniteFuture()) {
      latency_->Observe(absl::ToDoubleSeconds(now - output->oldest_submit));
    }
    cycles_->Increment();
    const NegotiatorStats stats = negotiator_->stats();
    tensors_->Increment(stats.tensors_negotiated - reported_.tensors_negotiated);
    cache_hits_->Increment(stats.cache_hits - reported_.cache_hits);
    cache_misses_->Increment(stats.cache_misses - reported_.cache_misses);
    reported_ = stats;
    const auto [bytes, allreduced] = RecordThroughput(*output, now);
    if (timeline_ != nullptr) {
      timeline_->Negotiation(negotiator_->DrainTimeline());
      if (!output->responses.empty()) timeline_->Cycle(now);
    }
    if (autotuner_ != nullptr) log_lines = Autotune(bytes, allreduced, now);
    auto cycle = std::make_shared<CycleBroadcast>();
    cycle->job_id = job_id_;
    cycle->output = *std::move(output);
    cycle->fusion_threshold_bytes = negotiator_->fusion_threshold_bytes();
    cycle->cycle_time_ms = absl::ToDoubleMilliseconds(negotiator_->cycle_time());
    cycle->seq = ++last_cycle_;
    cycle->cache_generation = generation_;
    if (awaiting_first_cycle_.load(std::memory_order_relaxed) && !cycle->output.responses.empty()) {
      awaiting_first_cycle_ = false;
      first_cycle_ = now;
      first_cycle_taken_ = false;
    }
    if (cycle->seq % kAckEvery == 0) {
      cycle->request_acks = last_request_;
      cycle->all_have = *std::min_element(acked_cycles_.begin(), acked_cycles_.end());
    }
    kept_.push_back(cycle);
    if (kept_.size() > kKeptCycles) {
      // A rank this far behind is gone (its worker is lost within the reconnect grace): should it
      // come back, Resend says what it missed.
      dropped_through_ = kept_.front()->seq;
      kept_.pop_front();
    }
    deliver(cycle);
    if (log_lines.empty()) return;
    // Posted under mu_, so the lines of successive cycles are written in order; the file I/O then
    // happens on the executor (never on a gRPC callback thread), under log_mu_ alone.
    io_.Post([self = shared_from_this(), lines = std::move(log_lines)] {
      absl::MutexLock log_lock(&self->log_mu_);
      self->WriteAutotuneLog(lines);
    });
  }
}

std::pair<int64_t, int64_t> JobRuntime::RecordThroughput(const CycleOutput& output,
                                                         absl::Time now) {
  Totals& t = totals_;
  int64_t bytes = 0, tensors = 0, allreduced = 0;
  for (const Response& r : output.responses) {
    if (r.type != Response::Type::kAllreduce && r.type != Response::Type::kBroadcast) continue;
    for (int64_t n : r.tensor_sizes) bytes += n * DataTypeSize(r.dtype);
    tensors += static_cast<int64_t>(r.names.size());
    if (r.type == Response::Type::kAllreduce) allreduced += static_cast<int64_t>(r.names.size());
  }
  t.bytes += bytes;
  t.tensors += tensors;
  t.allreduced += allreduced;
  ++t.cycles;
  t.time = now;
  if (window_.empty() || now - window_.back().time >= absl::Seconds(1)) {
    window_.push_back(t);
    while (window_.size() > 11) window_.pop_front();
  }
  return {bytes, allreduced};
}

std::vector<std::string> JobRuntime::Autotune(int64_t bytes, int64_t allreduced, absl::Time now) {
  Autotuner& tuner = *autotuner_;
  const AutotunePhase before = tuner.status().phase;
  std::optional<AutotuneParameters> change =
      tuner.Observe(bytes, allreduced, negotiator_->stats().distinct_tensors, now);
  if (change.has_value()) {
    negotiator_->SetParameters(
        change->fusion_threshold_bytes,
        absl::Microseconds(static_cast<int64_t>(change->cycle_time_ms * 1000)));
    negotiator_->SetCacheEnabled(change->cache_enabled);
  }
  const AutotuneStatus status = tuner.status();
  if (status.phase != before || change.has_value()) {
    spdlog::info(
        "job {} autotune {} (sample {}/{}): fusion_threshold={} bytes, cycle_time={} ms, cache={}; "
        "best so far {:.1f} MB/s",
        job_id_, AutotunePhaseName(status.phase), status.samples, status.max_samples,
        status.current.fusion_threshold_bytes, status.current.cycle_time_ms,
        status.current.cache_enabled ? "on" : "off", status.best_score / 1e6);
  }
  return tuner.TakeLog();
}

void JobRuntime::WriteAutotuneLog(const std::vector<std::string>& lines) {
  if (autotune_log_ == nullptr) return;
  for (const std::string& line : lines) std::fprintf(autotune_log_.get(), "%s\n", line.c_str());
  std::fflush(autotune_log_.get());
}

JobThroughput JobRuntime::Throughput(absl::Time until) const {
  JobThroughput out;
  out.fusion_threshold_bytes = negotiator_->fusion_threshold_bytes();
  out.cycle_time_ms = absl::ToDoubleMilliseconds(negotiator_->cycle_time());
  out.cache_enabled = negotiator_->cache_enabled();
  absl::MutexLock lock(&mu_);
  if (autotuner_ != nullptr) out.autotune = autotuner_->status();
  const Totals& now = totals_;
  out.tensors_negotiated = now.tensors;
  out.bytes_negotiated = now.bytes;
  if (until == absl::InfiniteFuture()) until = now.time;  // as of the last cycle
  // A job whose negotiation has been idle for a while moves nothing now, whatever its last window.
  if (!window_.empty() && until - now.time < kIdleAfter) {
    // Over the window that ends at `until`: from the newest snapshot at least the window's length
    // old (the oldest one while the job is younger than that).
    auto start = std::find_if(window_.rbegin(), window_.rend(),
                              [&](const Totals& t) { return until - t.time >= kWindow; });
    const Totals& then = start != window_.rend() ? *start : window_.front();
    const double seconds = absl::ToDoubleSeconds(until - then.time);
    if (seconds > 0) {
      out.bytes_per_second = (now.bytes - then.bytes) / seconds;
      out.cycles_per_second = (now.cycles - then.cycles) / seconds;
      const double allreduced_per_second = (now.allreduced - then.allreduced) / seconds;
      if (const int64_t distinct = negotiator_->stats().distinct_tensors; distinct > 0) {
        out.steps_per_second = allreduced_per_second / static_cast<double>(distinct);
      }
    }
  }
  return out;
}

StallReport JobRuntime::Housekeeping(absl::Time now) {
  if (timeline_ != nullptr) {
    absl::MutexLock lock(&mu_);  // keeps the events in order with the cycles'
    if (!closed_) timeline_->Negotiation(negotiator_->DrainTimeline());
  }
  StallReport report = negotiator_->CheckStalls(now);
  stalled_->Set(report.stalled);
  if (now - last_lateness_ >= kLatenessEvery) {
    last_lateness_ = now;
    const SlowRanks slow = WhoIsSlow();
    if (slow.lateness.steps > 0) {
      SetLatenessGauges(slow);
      NoteStraggler(slow);
    }
  }
  return report;
}

absl::Status JobRuntime::RecordRankExecution(int32_t rank, const ExecutionTracker::Sample& sample) {
  absl::MutexLock lock(&execution_mu_);
  return execution_.Reported(rank, sample);
}

namespace {

// A rank that asks late because its collectives end late (on a slow link, the ranks that receive
// over it finish last) is not late to submit: when the time it spends in collectives per step
// beyond the median rank's covers its lateness, it is not flagged.
void ExcuseLateCollectives(StragglerTracker::Report& lateness,
                           const ExecutionTracker::Report& execution) {
  std::vector<double> shares;
  for (const ExecutionTracker::RankFigures& f : execution.ranks) {
    if (f.measured) shares.push_back(f.collective_share);
  }
  if (shares.empty()) return;
  const double median = Median(shares);
  lateness.straggler = -1;
  absl::Duration worst;
  for (StragglerTracker::RankLateness& l : lateness.ranks) {
    if (!l.flagged) continue;
    const ExecutionTracker::RankFigures& f = execution.ranks[l.rank];
    if (f.measured &&
        l.behind_median <= lateness.step_time * std::max(0.0, f.collective_share - median)) {
      l.flagged = false;
      continue;
    }
    if (l.behind_median > worst) {
      worst = l.behind_median;
      lateness.straggler = l.rank;
    }
  }
}

}  // namespace

JobRuntime::SlowRanks JobRuntime::WhoIsSlow() const {
  SlowRanks slow;
  slow.lateness = negotiator_->Stragglers();
  {
    absl::MutexLock lock(&execution_mu_);
    slow.execution = execution_.Window();
  }
  ExcuseLateCollectives(slow.lateness, slow.execution);
  slow.named = slow.lateness.straggler >= 0 ? slow.lateness.straggler : slow.execution.slowest_link;
  return slow;
}

std::optional<JobStragglers> JobRuntime::Stragglers() const {
  const SlowRanks slow = WhoIsSlow();
  const StragglerTracker::Report& report = slow.lateness;
  if (report.steps == 0) return std::nullopt;
  JobStragglers out;
  out.steps = report.steps;
  out.last_step = report.last_step;
  out.step_seconds = absl::ToDoubleSeconds(report.step_time);
  out.straggler_rank = slow.named;
  std::vector<RankLateness> ranks;
  for (const StragglerTracker::RankLateness& l : report.ranks) {
    RankLateness r{
        .rank = l.rank,
        .behind_first_seconds = absl::ToDoubleSeconds(l.behind_first),
        .behind_median_seconds = absl::ToDoubleSeconds(l.behind_median),
        .flagged = l.flagged,
    };
    if (static_cast<size_t>(l.rank) < slow.execution.ranks.size()) {
      const ExecutionTracker::RankFigures& f = slow.execution.ranks[l.rank];
      r.measured = f.measured;
      r.collective_share = f.collective_share;
      r.network_share = f.network_share;
      r.link_bytes_per_second = f.link_bytes_per_second;
      r.host_link_bytes_per_second = f.host_link_bytes_per_second;
      r.others_link_bytes_per_second = f.others_link_bytes_per_second;
      r.slow_link = f.slow_link;
    }
    ranks.push_back(r);
  }
  const size_t n = std::min(kSlowest, ranks.size());
  // Named ranks first (late to submit, then slow link, slowest link first); then furthest behind.
  auto key = [](const RankLateness& r) {
    return std::make_tuple(!r.flagged, !r.slow_link, -r.behind_median_seconds,
                           r.slow_link ? r.link_bytes_per_second : 0.0, -r.behind_first_seconds,
                           r.rank);
  };
  std::partial_sort(ranks.begin(), ranks.begin() + n, ranks.end(),
                    [&](const RankLateness& a, const RankLateness& b) { return key(a) < key(b); });
  ranks.resize(n);
  out.slowest = std::move(ranks);
  return out;
}

JobRuntime::Naming JobRuntime::Describe(const SlowRanks& slow) const {
  Naming n;
  n.rank = slow.named;
  if (n.rank < 0 || static_cast<size_t>(n.rank) >= ranks_.size()) return n;
  if (n.rank == slow.lateness.straggler) {
    n.verdict = "late to submit";
    n.detail = absl::StrCat(
        absl::FormatDuration(
            absl::Trunc(slow.lateness.ranks[n.rank].behind_median, absl::Microseconds(100))),
        " behind the median rank per step over the last ", slow.lateness.steps, " steps");
    n.why = "late to submit: its compute or input is slow";
    return n;
  }
  const ExecutionTracker::RankFigures& f = slow.execution.ranks[n.rank];
  n.verdict = "slow link";
  n.detail = absl::StrFormat(
      "its host's link carries %.1f MB/s while the other hosts' median is %.1f MB/s, and "
      "its collectives spend %.0f%% of the time across hosts",
      f.host_link_bytes_per_second / 1e6, f.others_link_bytes_per_second / 1e6,
      f.network_share * 100);
  n.why = "slow link";
  return n;
}

void JobRuntime::NoteStraggler(const SlowRanks& slow) {
  const Naming n = Describe(slow);
  // What is named: a rank late to submit, or a host's link (whichever of its ranks has the lowest
  // rate at the moment: they share the link, so a change among them is no news).
  const std::string key = n.rank < 0                 ? ""
                          : n.verdict == "slow link" ? absl::StrCat("host ", ranks_[n.rank].host)
                                                     : absl::StrCat("rank ", n.rank);
  if (key == named_key_) return;
  // The timeline marks every change of what is named.
  if (timeline_ != nullptr) {
    NegotiationEvent e;
    e.kind = NegotiationEvent::Kind::kNamed;
    e.name = kWhoIsSlowTimelineRow;
    e.rank = n.rank;
    e.time = absl::Now();
    e.verdict = n.verdict;
    e.detail = n.detail;
    absl::MutexLock lock(&mu_);  // in order with the cycles' events
    if (!closed_) timeline_->Negotiation({std::move(e)});
  }
  named_key_ = key;
  if (straggler_action_ == "none" || n.rank < 0) return;
  straggler_notice_ = StragglerNotice{
      .message = absl::StrCat(Placement(ranks_[n.rank]), " holds the job back: ", n.detail, " (",
                              n.why, ")"),
      .rank = n.rank,
      .verdict = n.verdict,
  };
}

std::optional<JobRuntime::StragglerNotice> JobRuntime::TakeStragglerNotice() {
  std::optional<StragglerNotice> notice;
  notice.swap(straggler_notice_);
  return notice;
}

void JobRuntime::SetLatenessGauges(const SlowRanks& slow) {
  absl::MutexLock lock(&lateness_mu_);
  if (lateness_closed_) return;
  if (rank_gauges_.empty()) {
    for (const RankInfo& r : ranks_) {
      const Labels labels = {{"job", job_id_}, {"rank", absl::StrCat(r.rank)}};
      rank_gauges_.push_back(RankGauges{
          .lateness = &metrics_.GetGauge(
              "ringmaster_rank_lateness_seconds",
              "How late each rank asks for the job's collectives: its median lateness per step "
              "behind the median rank, over the last steps (at most 10).",
              labels),
          .collective = &metrics_.GetGauge(
              "ringmaster_rank_collective_time_ratio",
              "The share of the wall time each rank's collectives took over the last 1.5 s, as its "
              "worker measured it.",
              labels),
          .network = &metrics_.GetGauge(
              "ringmaster_rank_network_time_ratio",
              "The share of the wall time each rank spent inside network communicators (the "
              "cross-host step, or a flat collective's whole) over the last 1.5 s.",
              labels),
          .link = &metrics_.GetGauge(
              "ringmaster_rank_link_send_bytes_per_second",
              "Each rank's link rate: the highest delivery-rate sample (the kernel's, as BBR "
              "measures it) of its data-plane TCP connections over the last 1.5 s (0: too few "
              "bytes "
              "to say).",
              labels),
      });
    }
    straggler_ = &metrics_.GetGauge(
        "ringmaster_straggler_rank",
        "The rank named as holding the job back (late to its collectives, or its host's link "
        "slow, beyond the thresholds); -1 when none is.",
        {{"job", job_id_}});
  }
  for (const StragglerTracker::RankLateness& r : slow.lateness.ranks) {
    if (static_cast<size_t>(r.rank) < rank_gauges_.size()) {
      rank_gauges_[r.rank].lateness->Set(absl::ToDoubleSeconds(r.behind_median));
    }
  }
  for (size_t r = 0; r < slow.execution.ranks.size() && r < rank_gauges_.size(); ++r) {
    const ExecutionTracker::RankFigures& f = slow.execution.ranks[r];
    rank_gauges_[r].collective->Set(f.collective_share);
    rank_gauges_[r].network->Set(f.network_share);
    rank_gauges_[r].link->Set(f.link_bytes_per_second);
  }
  straggler_->Set(slow.named);
}

void JobRuntime::RecordExecution(int32_t rank, std::vector<ExecutionSpan> spans, int64_t skew_us) {
  if (timeline_ != nullptr) timeline_->Execution(rank, std::move(spans), skew_us);
}

std::optional<JobRuntime::TimelineSnapshot> JobRuntime::Timeline() const {
  if (timeline_ == nullptr) return std::nullopt;
  return TimelineSnapshot{timeline_name_, timeline_->StableSize()};
}

void JobRuntime::Close() {
  // A second caller waits for the first to be done: once Close() returns, the files are complete.
  absl::MutexLock close_lock(&close_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    // Under mu_, the last events queue in order behind those of earlier cycles.
    if (timeline_ != nullptr) timeline_->Negotiation(negotiator_->DrainTimeline());
  }
  stalled_->Set(0);  // an ended job stalls nothing
  {
    // An ended job's per-rank series go (a coordinator runs many jobs of many ranks).
    absl::MutexLock lock(&lateness_mu_);
    lateness_closed_ = true;
    if (!rank_gauges_.empty()) {
      for (const RankInfo& r : ranks_) {
        const Labels labels = {{"job", job_id_}, {"rank", absl::StrCat(r.rank)}};
        for (const char* name :
             {"ringmaster_rank_lateness_seconds", "ringmaster_rank_collective_time_ratio",
              "ringmaster_rank_network_time_ratio", "ringmaster_rank_link_send_bytes_per_second"}) {
          metrics_.RemoveGauge(name, labels);
        }
      }
      metrics_.RemoveGauge("ringmaster_straggler_rank", {{"job", job_id_}});
      rank_gauges_.clear();
      straggler_ = nullptr;
    }
  }
  // File I/O (the writer's last flush, its join) with no lock held; what arrives later is dropped.
  if (timeline_ != nullptr) timeline_->Close();
  absl::MutexLock lock(&log_mu_);
  autotune_log_.reset();
}

}  // namespace ringmaster
