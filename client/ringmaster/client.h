// Ringmaster's C++ client: what a training process links to talk to its rank's worker daemon.
//
//   auto client = ringmaster::Client::Connect();           // uses $RINGMASTER_SOCKET
//   float* grad = static_cast<float*>((*client)->Allocate(n * sizeof(float)));  // zero-copy
//   auto h = (*client)->AllreduceAsync("grad", grad, ringmaster::DataType::kFloat32, {n});
//   absl::Status s = (*client)->Wait(*h);                  // grad now holds the average
//
// Enqueueing never blocks; many operations may be in flight; each completes with the coordinator's
// or the backend's error message when it fails. Tensors placed in the shared arena (Allocate) are
// reduced in place with no copy; others are staged through the arena (one copy in, one out).
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/tensor.h"

namespace ringmaster {

using Handle = uint64_t;

struct Topology {
  std::string job_id;
  // The job's epoch this process was welcomed into (elastic jobs start a new one at each
  // membership change).
  int64_t epoch = 0;
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  int cross_rank = 0;
  int cross_size = 1;
  std::string host;
  // The CUDA device this rank's daemon serves, or -1 for a CPU slot. On a GPU slot, Allocate()
  // returns device memory (in the arena the daemon shares through CUDA IPC), tensors passed in are
  // device (or host) pointers, and work is ordered on the CUDA stream the submitting thread set
  // with SetCudaStream() (default: the legacy default stream) through interprocess events: Wait()
  // returns once that stream is made to wait for the result, so kernels the caller then enqueues on
  // it see the result.
  int device = -1;
  // Bytes of the shared arena this process may use (Allocate, and tensors staged in flight).
  size_t arena_bytes = 0;
  // CPU slots: the daemon reduces allreduce tensors where they are, in this process's memory
  // (LocalWelcome.direct_access): no staging copy (each still at most the worker's arena).
  bool direct_access = false;
};

struct AllgatherOutput {
  std::vector<int64_t> shape;  // first dimension summed over ranks
  std::vector<uint8_t> data;
};

class Client {
 public:
  // Connects to the daemon at `socket_path` ("" = $RINGMASTER_SOCKET), retrying while the daemon
  // has no job yet, until `timeout`. Elastic jobs: `after_epoch` > 0 (the epoch of the connection
  // this process leaves after a reset) waits for the job's next epoch, which the daemon asks the
  // coordinator for.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(std::string socket_path = "",
                                                         absl::Duration timeout = absl::Seconds(60),
                                                         int64_t after_epoch = 0);
  virtual ~Client() = default;

  virtual const Topology& topology() const = 0;
  int rank() const { return topology().rank; }
  int size() const { return topology().size; }

  // Memory in the shared arena (64-byte aligned), or nullptr when it is full. Free() returns it (on
  // a GPU slot, once the work queued so far on this thread's stream is done).
  virtual void* Allocate(size_t bytes) = 0;
  // GPU slots: the cudaStream_t that this thread's tensors are produced and consumed on (nullptr:
  // the legacy default stream), for the operations this thread submits from now on (each keeps
  // the stream it was submitted with). Per thread, so threads submitting on different streams do
  // not race. Ignored on CPU slots.
  virtual void SetCudaStream(void* stream) {}
  // Horovod's process sets: the operations this thread submits from now on run in process set `id`
  // among `ranks` (increasing job ranks, this one among them), until it is set again; id 0 (no
  // ranks) is the global set, the default. Per thread, as SetCudaStream.
  virtual void SetProcessSet(int32_t id, std::vector<int32_t> ranks) {}
  virtual void Free(void* data) = 0;

  // `data` holds the input and receives the result; it must stay valid until the operation
  // completes. `op` kAverage divides the sum by size() (integers: truncating).
  virtual absl::StatusOr<Handle> AllreduceAsync(const std::string& name, void* data, DataType dtype,
                                                absl::Span<const int64_t> shape,
                                                ReduceOp op = ReduceOp::kAverage,
                                                double prescale = 1.0, double postscale = 1.0) = 0;
  // Allreduces the tensors as one group: they are negotiated and fused together (in one response,
  // whatever the fusion threshold). Every rank must issue its grouped allreduces in the same order,
  // or pass each the `group` it reserved (ReserveGroup) in that order. One handle per tensor.
  virtual absl::StatusOr<std::vector<Handle>> GroupedAllreduceAsync(
      const std::vector<std::string>& names, const std::vector<void*>& data, DataType dtype,
      const std::vector<std::vector<int64_t>>& shapes, ReduceOp op = ReduceOp::kAverage,
      double prescale = 1.0, double postscale = 1.0, int32_t group = 0) = 0;
  // The id of a grouped allreduce submitted later, possibly from another thread and after groups
  // reserved after it (an engine that runs operations out of order): ids follow the order of
  // these calls, which every rank must follow.
  virtual int32_t ReserveGroup() = 0;
  virtual absl::StatusOr<Handle> BroadcastAsync(const std::string& name, void* data, DataType dtype,
                                                absl::Span<const int64_t> shape, int root) = 0;
  // The first dimension may differ per rank; the output comes from TakeAllgather().
  virtual absl::StatusOr<Handle> AllgatherAsync(const std::string& name, const void* data,
                                                DataType dtype,
                                                absl::Span<const int64_t> shape) = 0;

  // true once the operation completed (successfully or not).
  virtual bool Poll(Handle handle) = 0;
  // Waits for the operation; its error otherwise. DEADLINE_EXCEEDED after `timeout` (the operation
  // stays in flight). NOT_FOUND for an unknown or already-waited handle.
  virtual absl::Status Wait(Handle handle, absl::Duration timeout = absl::InfiniteDuration()) = 0;
  // The result of a completed allgather (after Wait() returned OK).
  virtual absl::StatusOr<AllgatherOutput> TakeAllgather(Handle handle) = 0;
  // Instead of Wait(): calls `done` with the operation's status once it completes, on the
  // client's reader thread (at once on this thread if it has completed already). The handle is
  // consumed as by Wait(); an allgather's output is kept for TakeAllgather(). `done` must not block
  // (nor call Wait()); it is called exactly once, also when the connection closes (CANCELLED).
  // CPU slots: a GPU slot's result is ordered on the operation's stream, not waited for.
  virtual absl::Status Then(Handle handle, std::function<void(absl::Status)> done) = 0;

  // Blocks until every rank has joined; returns the last rank that joined. While joined, this rank
  // contributes zeros to other ranks' allreduces.
  virtual absl::StatusOr<int> Join() = 0;
  virtual absl::Status Barrier() = 0;
  // Join() and Barrier() without waiting: a handle to Wait() on (in slices, so a caller can handle
  // signals between them); after a join's Wait() returned OK, last_joined_rank() is its result.
  virtual absl::StatusOr<Handle> JoinAsync() = 0;
  virtual absl::StatusOr<Handle> BarrierAsync() = 0;
  virtual int last_joined_rank() const = 0;
  // Horovod's remove_process_set, on this rank's side: a barrier of every rank of the job, after
  // which each rank's daemon releases the communicators of process set `id` (every rank calls it
  // with the same id, once no collective of the set is in flight). A later collective in the set
  // fails. Set ids are never reused.
  virtual absl::Status ReleaseProcessSet(int32_t id) = 0;
  virtual absl::StatusOr<Handle> ReleaseProcessSetAsync(int32_t id) = 0;

  // Elastic jobs: whether a completion said that workers were added to the job (the process
  // should reset into the epoch that adds them at its next commit).
  virtual bool hosts_updated() const { return false; }

  // Closes the connection; operations still in flight fail with CANCELLED.
  virtual void Shutdown() = 0;
};

}  // namespace ringmaster
