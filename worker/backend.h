// A communicator among the ranks of one job epoch: the collectives the engine executes. Gloo on CPU
// (gloo_backend.h), NCCL on CUDA devices (a later milestone). Errors are absl::Status with the
// library's own message kept; every operation has the timeout given at creation.
//
// Not thread-safe: one engine thread owns a backend and calls it.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/tensor.h"

namespace ringmaster {

class Backend {
 public:
  virtual ~Backend() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place over `count` elements of `dtype` at `data`. `op` is kSum, kMin, kMax or kProduct
  // (averaging is a sum the engine then scales). float16 and bfloat16 are reduced exactly as their
  // float32 values rounded back to nearest-even.
  virtual absl::Status Allreduce(void* data, int64_t count, DataType dtype, ReduceOp op) = 0;

  // Copies `bytes` bytes at `data` on rank `root` to `data` on every rank.
  virtual absl::Status Broadcast(void* data, int64_t bytes, int root) = 0;

  // Concatenates every rank's part, in rank order, into `out` on every rank. `bytes[r]` is rank r's
  // part; this rank's part is at `in`. `out` holds the sum of `bytes`.
  virtual absl::Status Allgatherv(const void* in, void* out, absl::Span<const int64_t> bytes) = 0;

  virtual absl::Status Barrier() = 0;
};

}  // namespace ringmaster
