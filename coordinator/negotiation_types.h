// Plain data exchanged with the Negotiator: what a rank asks for and what every rank executes. The
// service layer converts these to and from ringmaster.v1 messages.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
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

  // Same metadata (everything but nothing: names included).
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
};

struct CacheAssignment {
  std::string name;
  uint32_t id = 0;
};

// What one rank alone is told.
struct RankNotice {
  std::vector<uint32_t> resend_ids;
  // Requests rejected for this rank alone (invalid, or a name already in flight): kError responses.
  std::vector<Response> errors;

  bool empty() const { return resend_ids.empty() && errors.empty(); }
};

// The outcome of one negotiation cycle of a job.
struct CycleOutput {
  std::vector<CacheAssignment> cache_assignments;
  std::vector<uint32_t> evicted_ids;
  std::vector<Response> responses;  // the same for every rank
  std::vector<RankNotice> notices;  // indexed by rank
  // When the oldest tensor in `responses` was first submitted (negotiation latency: first request
  // to response); InfiniteFuture when the cycle carries notices only.
  absl::Time oldest_submit = absl::InfiniteFuture();
};

// A step of a tensor's negotiation, recorded for the timeline when a job has one.
struct NegotiationEvent {
  enum class Kind {
    kStart,      // the first rank submitted the tensor
    kRankReady,  // `rank` submitted it (the first rank too)
    kEnd,        // every rank submitted it: ready to leave in a response
  };
  Kind kind = Kind::kStart;
  std::string name;
  RequestType type = RequestType::kUnspecified;
  int32_t rank = -1;
  absl::Time time;
};

}  // namespace ringmaster
