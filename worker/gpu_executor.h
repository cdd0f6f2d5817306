// A GPU rank's executor: collectives on the device arena through a DeviceExecutor (GpuJob, NCCL on
// one CUDA stream; device_executor.h). No CUDA here: the ordering (ready events waited on, a done
// event recorded) is the device's; this maps a Collective onto its calls and places allgather
// outputs. Any failure is fatal for the rank: NCCL matches calls by order, so a rank that skipped
// one would be out of step with its peers.
#pragma once

#include <string>

#include "common/shared_memory.h"
#include "worker/device_executor.h"
#include "worker/executor.h"

namespace ringmaster {

class GpuExecutor final : public Executor {
 public:
  // `device` and `outputs` (where allgather outputs are allocated) are borrowed and outlive this.
  GpuExecutor(DeviceExecutor* device, ArenaAllocator* outputs, int rank, int size)
      : device_(*device), outputs_(*outputs), rank_(rank), size_(size) {}

  absl::Status Setup() override { return device_.Setup(); }
  absl::StatusOr<Executed> Execute(const Collective& c, ExecutionTrace& trace) override;
  // Any failure but a refused process set (no NCCL call was made: a set past the bound on those
  // kept, a worker that cannot make them). NCCL's own errors are never RESOURCE_EXHAUSTED.
  bool Fatal(const absl::Status& status) const override {
    return status.code() != absl::StatusCode::kUnimplemented &&
           status.code() != absl::StatusCode::kResourceExhausted;
  }
  void Abort(const std::string& why) override { device_.Abort(why); }

 private:
  DeviceExecutor& device_;
  ArenaAllocator& outputs_;
  const int rank_;
  const int size_;
};

}  // namespace ringmaster
