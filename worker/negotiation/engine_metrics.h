// The engine's metric series (docs/metrics.md, "Worker"): registered once per rank, labelled with
// its job, rank and host, and observed by the engine thread as responses execute, operations
// queue, local rounds end and collectives fail. A null registry records nothing (the engine's
// cost without metrics, bench/metrics_cost.sh).
//
// Thread-safe as the registry's series are; Executed() is the engine thread's.
#pragma once

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "common/negotiation_types.h"

namespace ringmaster {

class EngineMetrics {
 public:
  // `registry` null: nothing recorded. `size`: the job's ranks (for the bus bandwidth).
  EngineMetrics(MetricsRegistry* registry, const std::string& job_id, int rank,
                const std::string& host, int size);
  // The rank is gone: its levels drop to zero rather than freeze at their last value.
  ~EngineMetrics();

  // A response executed successfully in `took`: `bytes` this rank contributed, `tensors` fused,
  // against the fusion threshold the last list gave (0: none).
  void Executed(Response::Type type, int64_t bytes, size_t tensors, absl::Duration took,
                int64_t fusion_threshold);
  // Collectives enqueued and not yet done.
  void QueueDepth(size_t depth);
  // A local round ended: completed there, or diverted to the coordinator.
  void LocalRound(bool completed);
  // A collective failed; `kind`: negotiation, peer, job_stopped or other.
  void Error(absl::string_view kind);

 private:
  MetricsRegistry own_;  // where a null registry's series go, unread
  MetricsRegistry* const registry_;
  const bool record_;
  const int size_;
  Labels labels_;
  Counter* bytes_[3];      // allreduce, broadcast, allgather
  Histogram* latency_[4];  // allreduce, broadcast, allgather, barrier
  Histogram* fused_tensors_;
  Histogram* fill_ratio_;
  Gauge* bus_bandwidth_;
  Gauge* queue_depth_;
  Counter* local_rounds_[2];  // completed, diverted
};

}  // namespace ringmaster
