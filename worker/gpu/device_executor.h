// The engine's GPU side, behind an interface so the engine needs no CUDA headers: executes a
// response's collective on tensors in the device arena, on one CUDA stream, with NCCL. Implemented
// by GpuJob (worker/gpu/gpu_job.h); built only with CUDA.
//
// Ordering without host round trips: a tensor's ready event (recorded by the training process on
// its stream, 1-based index into the events it shared; 0: none) is waited on by the daemon's stream
// before the pack; the returned done event (1-based index into the events the daemon shared) is
// recorded on the daemon's stream after the unpack, and the training process's stream waits on it.
//
// Engine thread only, except Abort().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tensor.h"

namespace ringmaster {

class DeviceExecutor {
 public:
  struct Tensor {
    int64_t offset = -1;  // in the device arena; -1: this rank has none (joined): zeros
    int64_t count = 0;    // elements
    int32_t ready_event = 0;
  };

  virtual ~DeviceExecutor() = default;

  // Creates the communicator (rendezvous included). Called once, first, on the engine thread.
  virtual absl::Status Setup() = 0;
  // Opens the training process's ready events (LocalReadyEvents), once per connection.
  virtual absl::Status OpenReadyEvents(const std::vector<std::string>& handles) = 0;

  // Selects the communicator the calls after it run on: the job's (`ranks` empty), or process set
  // `id`'s (`ranks`: its job ranks in increasing order, this rank among them), created on first use
  // with the set's members (who execute the same responses in the same order, so they create it
  // together). INVALID_ARGUMENT when this rank is not a member; RESOURCE_EXHAUSTED past a bound on
  // the sets kept.
  virtual absl::Status UseProcessSet(int32_t id, const std::vector<int32_t>& ranks) = 0;
  // Frees process set `id`'s communicator (no collective of it is in flight: Executor's
  // ReleaseProcessSet); a later UseProcessSet of it is refused.
  virtual void ReleaseProcessSet(int32_t id) = 0;

  // Each returns the done event (1-based) once the collective has completed on the device.
  virtual absl::StatusOr<int32_t> Allreduce(const std::vector<Tensor>& tensors, DataType dtype,
                                            ReduceOp op, double prescale, double postscale) = 0;
  virtual absl::StatusOr<int32_t> Broadcast(const Tensor& tensor, int64_t bytes, int root) = 0;
  // `in` has this rank's part; the concatenation goes to `out_offset` in the arena, or, with -1 (it
  // did not fit there), to device scratch, taking part for the peers' sake and discarded.
  virtual absl::StatusOr<int32_t> Allgather(const Tensor& in, int64_t out_offset,
                                            const std::vector<int64_t>& bytes) = 0;
  virtual absl::Status Barrier() = 0;

  // Any thread: aborts the communicator (a peer is gone, the job stopped).
  virtual void Abort(const std::string& why) = 0;
};

}  // namespace ringmaster
