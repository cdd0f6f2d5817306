// A GPU rank's executor: collectives on the device arena through a DeviceExecutor (GpuJob, NCCL on
// one CUDA stream; device_executor.h). No CUDA here: the ordering (ready events waited on, a done
// event recorded) is the device's; this maps a Collective onto its calls and places allgather
// outputs. Any failure is fatal for the rank: NCCL matches calls by order, so a rank that skipped
// one would be out of step with its peers.
#pragma once

#include <string>

#include "common/shared_memory.h"
#include "worker/executor.h"
#include "worker/gpu/device_executor.h"

namespace ringmaster {

class GpuExecutor final : public Executor {
 public:
  // `device` and `outputs` (where allgather outputs are allocated) are borrowed and outlive this.
  GpuExecutor(DeviceExecutor* device, ArenaAllocator* outputs, int rank, int size)
      : device_(*device), outputs_(*outputs), rank_(rank), size_(size) {}

  absl::Status Setup() override { return device_.Setup(); }
  absl::StatusOr<Executed> Execute(const Collective& c, ExecutionTrace& trace) override;
  // Any failure but a worker that cannot make process sets at all (no NCCL call was made, and every
  // member refuses alike) and an allgather whose output did not fit the arena (the rank took part
  // all the same: FailedAlone). Anything else may leave this rank out of step with its peers'
  // NCCL calls (a set past the bound on this rank alone, a set's communicator that could not be
  // made, a device failure): the rank fails.
  bool Fatal(const absl::Status& status) const override {
    return status.code() != absl::StatusCode::kUnimplemented && !IsFailedAlone(status);
  }
  void Abort(const std::string& why) override { device_.Abort(why); }
  void ReleaseProcessSet(int32_t id) override { device_.ReleaseProcessSet(id); }

 private:
  // The allgather's NCCL calls, one per tensor, each into an output of the arena (or device
  // scratch when none fits: that tensor's allgather then fails alone), recorded in `executed`.
  absl::StatusOr<int32_t> Allgather(const Collective& c, Executed& executed);
  DeviceExecutor& device_;
  ArenaAllocator& outputs_;
  const int rank_;
  const int size_;
};

}  // namespace ringmaster
