// What executes a negotiated collective on this rank's data: one interface for CPU ranks
// (CpuExecutor, cpu_executor.h: Gloo communicators on the host arena) and GPU ranks (GpuExecutor,
// gpu_executor.h: NCCL on the device arena, through GpuJob). The engine turns each coordinator
// response into a Collective (the project's own types, no protobuf) and hands it to its executor on
// the engine thread; queueing, the response cache and completions stay in the engine.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/tensor.h"

namespace ringmaster {

// One negotiated response as this rank executes it.
struct Collective {
  enum class Type { kAllreduce, kAllgather, kBroadcast, kBarrier };
  Type type = Type::kAllreduce;
  DataType dtype = DataType::kUnspecified;
  ReduceOp op = ReduceOp::kSum;  // kAverage (or kUnspecified): a sum divided by the job's size
  double prescale = 1.0;
  double postscale = 1.0;
  int root = 0;  // broadcast

  struct Tensor {
    int64_t offset = -1;      // in the arena; -1: this rank has none (it joined): zeros, or scratch
    int32_t ready_event = 0;  // GPU: the training process's ready event (1-based; 0: none)
    std::vector<int64_t> shape;  // this rank's (empty when it has none)
    // Allreduce on a CPU slot: the tensor at this address of process `pid` instead (LocalOp).
    uint64_t address = 0;
    int32_t pid = 0;
  };
  std::vector<Tensor> tensors;  // in the response's (fused) order
  // Allreduce and broadcast: elements of each tensor. Allgather: each tensor's first dimension on
  // each rank, tensor-major (tensor t on rank k at t * size + k).
  std::vector<int64_t> sizes;
  // Allgather: elements per first-dimension row of each tensor (the same on every rank; a joined
  // rank has no shape of its own). Missing entries: from this rank's shape.
  std::vector<int64_t> row_elements;
  // Horovod's process set it runs in: 0 (no ranks) the global one; else its members, increasing
  // (this rank among them). `sizes` of an allgather are then per member, and the root of a
  // broadcast is a job rank.
  int32_t process_set_id = 0;
  std::vector<int32_t> process_set_ranks;

  bool average() const { return op == ReduceOp::kAverage || op == ReduceOp::kUnspecified; }
};

// What executing a collective produced, for the completions.
struct Executed {
  // Allgather: where each tensor's concatenation was written in the arena (its memory is the
  // training process's to release), and its shape. Empty for the other collectives.
  struct Output {
    int64_t offset = -1;  // -1: none (a tensor this rank does not have)
    std::vector<int64_t> shape;
  };
  std::vector<Output> outputs;
  int32_t done_event = 0;  // GPU: recorded once the result is in place (1-based; 0: none)
};

// The activities of one execution, for the timeline: each ends when End is called.
class ExecutionTrace {
 public:
  ExecutionTrace(bool on, absl::Time arrived) : on_(on), arrived_(arrived) {}
  absl::Time arrived() const { return arrived_; }  // when the response list reached the worker
  void End(const char* name) {
    if (on_) ends_.emplace_back(name, absl::ToUnixMicros(absl::Now()));
  }
  const std::vector<std::pair<const char*, int64_t>>& ends() const { return ends_; }

 private:
  const bool on_;
  const absl::Time arrived_;
  std::vector<std::pair<const char*, int64_t>> ends_;
};

class LocalRounds;

class Executor {
 public:
  virtual ~Executor() = default;

  // Creates the communicators (rendezvous included). Called once, first, on the engine thread.
  virtual absl::Status Setup() = 0;
  // Executes one collective (engine thread). On failure nothing is left allocated for it.
  virtual absl::StatusOr<Executed> Execute(const Collective& collective, ExecutionTrace& trace) = 0;
  // Whether a collective that failed with `status` leaves the rank unable to go on (the engine then
  // fails everything else): a failed Gloo collective leaves its communicator unusable; on a GPU
  // any failure does (NCCL matches calls by order).
  virtual bool Fatal(const absl::Status& status) const = 0;
  // Any thread: a collective stuck on a lost peer must return (the job stopped, a peer is gone).
  virtual void Abort(const std::string& why) = 0;
  // Engine thread, after a barrier of every rank named kReleaseProcessSetPrefix + id (no
  // collective of the set is in flight anywhere): frees process set `id`'s communicators; a
  // later collective in it is refused.
  virtual void ReleaseProcessSet(int32_t id) = 0;
  // After Setup: where this rank negotiates a lone cached collective with the job's other ranks
  // without the coordinator (local_rounds.h), or null where it cannot (ranks on several hosts, no
  // shared memory, a GPU).
  virtual LocalRounds* local_rounds() { return nullptr; }
};

// A failure of one collective's own (its output did not fit this rank's arena) after the rank took
// part in it all the same, so its peers and the communicator stay in step and the next collective
// works: Executor::Fatal may say false for it on any executor.
absl::Status FailedAlone(absl::Status status);
bool IsFailedAlone(const absl::Status& status);

// The message of an allgather output of `bytes` that did not fit the shared arena (`why`).
std::string AllgatherOutputTooLarge(int64_t bytes, absl::string_view why);

// The bytes an allgather tensor moves: this rank's shape, every rank's bytes, and the result's rows
// and bytes.
struct AllgatherPart {
  std::vector<int64_t> shape;
  std::vector<int64_t> bytes;
  int64_t rows = 0;
  int64_t total = 0;
};
// INVALID_ARGUMENT for a response with too few sizes.
absl::StatusOr<std::vector<AllgatherPart>> PlanAllgather(const Collective& c, int size);
// The output of an allgather tensor written at `offset`: its rows, then this rank's other
// dimensions.
Executed::Output GatheredOutput(const AllgatherPart& part, int64_t offset);

}  // namespace ringmaster
