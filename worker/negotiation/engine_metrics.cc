#include "worker/negotiation/engine_metrics.h"

#include "absl/strings/str_cat.h"

namespace ringmaster {
EngineMetrics::EngineMetrics(MetricsRegistry* registry, const std::string& job_id, int rank,
                             const std::string& host, int size)
    : registry_(registry != nullptr ? registry : &own_),
      record_(registry != nullptr),
      size_(size),
      labels_({{"job", job_id}, {"rank", absl::StrCat(rank)}, {"host", host}}) {
  const char* ops[] = {"allreduce", "broadcast", "allgather", "barrier"};
  for (int i = 0; i < 4; ++i) {
    Labels with_op = labels_;
    with_op.emplace_back("op", ops[i]);
    if (i < 3) {
      bytes_[i] = &registry_->GetCounter(
          "ringmaster_collective_bytes_total",
          "Bytes this rank contributed to collectives (allreduce, broadcast, allgather).", with_op);
    }
    latency_[i] = &registry_->GetHistogram(
        "ringmaster_collective_latency_seconds",
        "Time to execute one response (pack, collective, scale, unpack), by collective.",
        ExponentialBuckets(0.00005, 2, 18), with_op);
  }
  fused_tensors_ = &registry_->GetHistogram("ringmaster_fused_tensors",
                                            "Tensors per executed allreduce response.",
                                            ExponentialBuckets(1, 2, 11), labels_);
  fill_ratio_ =
      &registry_->GetHistogram("ringmaster_fusion_buffer_fill_ratio",
                               "Bytes of an allreduce response divided by the fusion threshold.",
                               {0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 1}, labels_);
  bus_bandwidth_ = &registry_->GetGauge(
      "ringmaster_bus_bandwidth_bytes_per_second",
      "Bus bandwidth of the last allreduce response: 2(n-1)/n x bytes / time.", labels_);
  queue_depth_ = &registry_->GetGauge(
      "ringmaster_queue_depth", "Collectives enqueued by the training process and not yet done.",
      labels_);
  const char* outcomes[] = {"completed", "diverted"};
  for (int i = 0; i < 2; ++i) {
    Labels with_outcome = labels_;
    with_outcome.emplace_back("outcome", outcomes[i]);
    local_rounds_[i] = &registry_->GetCounter(
        "ringmaster_local_negotiations_total",
        "Lone cached allreduces this rank negotiated with the job's other ranks through shared "
        "memory: completed there, or diverted to the coordinator.",
        with_outcome);
  }
  // Every kind exists from the start at 0, so rate() counts the first error too.
  for (const char* kind : {"negotiation", "peer", "job_stopped", "other"}) {
    Labels with_kind = labels_;
    with_kind.emplace_back("kind", kind);
    registry_->GetCounter("ringmaster_errors_total", "Collectives that failed, by kind of error.",
                          with_kind);
  }
}

EngineMetrics::~EngineMetrics() {
  queue_depth_->Set(0);
  bus_bandwidth_->Set(0);
}

void EngineMetrics::Executed(Response::Type type, int64_t bytes, size_t tensors,
                             absl::Duration took, int64_t fusion_threshold) {
  if (!record_) return;
  const double seconds = absl::ToDoubleSeconds(took);
  switch (type) {
    case Response::Type::kAllreduce:
      bytes_[0]->Increment(static_cast<double>(bytes));
      latency_[0]->Observe(seconds);
      fused_tensors_->Observe(static_cast<double>(tensors));
      if (fusion_threshold > 0) {
        fill_ratio_->Observe(static_cast<double>(bytes) / static_cast<double>(fusion_threshold));
      }
      if (seconds > 0 && size_ > 1) {
        bus_bandwidth_->Set(2.0 * (size_ - 1) / size_ * static_cast<double>(bytes) / seconds);
      }
      break;
    case Response::Type::kBroadcast:
      bytes_[1]->Increment(static_cast<double>(bytes));
      latency_[1]->Observe(seconds);
      break;
    case Response::Type::kAllgather:
      bytes_[2]->Increment(static_cast<double>(bytes));
      latency_[2]->Observe(seconds);
      break;
    case Response::Type::kBarrier:
      latency_[3]->Observe(seconds);
      break;
    default:
      break;
  }
}

void EngineMetrics::QueueDepth(size_t depth) {
  if (record_) queue_depth_->Set(static_cast<double>(depth));
}

void EngineMetrics::LocalRound(bool completed) {
  if (record_) local_rounds_[completed ? 0 : 1]->Increment();
}

void EngineMetrics::Error(absl::string_view kind) {
  if (!record_) return;
  Labels with_kind = labels_;
  with_kind.emplace_back("kind", std::string(kind));
  registry_
      ->GetCounter("ringmaster_errors_total", "Collectives that failed, by kind of error.",
                   with_kind)
      .Increment();
}

}  // namespace ringmaster
