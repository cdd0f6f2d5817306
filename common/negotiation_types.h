// What a rank asks the coordinator to negotiate and what every rank executes: plain data shared by
// the coordinator (negotiator, response cache) and the workers (engine, worker cache). Protobuf is
// converted at the edges (common/negotiation_wire.h).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/tensor.h"

namespace ringmaster {

// One rank's request for one collective (Horovod's Request).
struct TensorRequest {
  std::string name;
  RequestType type = RequestType::kUnspecified;
  DataType dtype = DataType::kUnspecified;
  std::vector<int64_t> shape;
  int32_t root_rank = 0;
  ReduceOp reduce_op = ReduceOp::kAverage;
  double prescale_factor = 1.0;
  double postscale_factor = 1.0;
  int32_t device = -1;   // -1: CPU; N: cuda:N
  int32_t group_id = 0;  // > 0: member of a grouped collective, fused with its group
  int32_t group_size = 0;
  // Horovod's process set: 0 (no ranks) the global one; else its member ranks, increasing.
  int32_t process_set_id = 0;
  std::vector<int32_t> process_set_ranks;

  // Equal in every field, the name included.
  bool operator==(const TensorRequest&) const = default;
};

// What every rank executes, in the order given (Horovod's Response).
struct Response {
  enum class Type { kAllreduce, kAllgather, kBroadcast, kJoin, kBarrier, kError };

  Type type = Type::kError;
  std::vector<std::string> names;
  std::vector<uint32_t> cache_ids;  // parallel to names; 0: none
  DataType dtype = DataType::kUnspecified;
  ReduceOp reduce_op = ReduceOp::kAverage;
  double prescale_factor = 1.0;
  double postscale_factor = 1.0;
  int32_t root_rank = 0;
  int32_t device = -1;
  // Allreduce/broadcast: elements per tensor. Allgather: first dimension of tensor t on rank r at
  // t * size + r.
  std::vector<int64_t> tensor_sizes;
  // Allgather: elements per first-dimension row of each tensor.
  std::vector<int64_t> row_elements;
  std::string error_message;
  int32_t last_joined_rank = -1;
  // The process set it runs in (0: the global one); ranks outside it skip it. An allgather in a set
  // has tensor_sizes per member.
  int32_t process_set_id = 0;
  std::vector<int32_t> process_set_ranks;
};

struct CacheAssignment {
  std::string name;
  uint32_t id = 0;
};

// One rank's requests of one cycle: full requests for tensors seen the first time, cache ids for
// the rest. The engine fills job, epoch, rank and generation; its session numbers it (seq, acks).
struct RequestBatch {
  std::string job_id;
  int64_t epoch = 0;
  int32_t rank = 0;
  std::vector<TensorRequest> requests;
  std::vector<uint32_t> cached_ids;
  uint64_t seq = 0;            // the rank's batch number (0: unnumbered)
  uint64_t ack_responses = 0;  // the last response list the rank received in order
  uint64_t cache_generation = 0;
  // Cache ids used in local negotiation since the rank's last batch (recency for the cache).
  std::vector<uint32_t> used_ids;
};

// One executed response on one rank, as its worker reports it for the timeline: consecutive
// activities from `start_unix_us`, each ending at its time.
struct ExecutionSpan {
  std::vector<std::string> tensors;
  std::string op;  // "ALLREDUCE", "BROADCAST", "ALLGATHER", "BARRIER"
  int64_t start_unix_us = 0;
  std::vector<std::pair<std::string, int64_t>> activities;  // name, end (unix us)
};

}  // namespace ringmaster
