// The executor a rank's engine runs its collectives on: on a CPU slot the CPU executor (the
// host's shared-memory group, Gloo communicators among the job's ranks and its process sets); on
// a GPU slot the GPU executor over the device side (device arena, ready events, NCCL), which the
// runner keeps alive and shares with the training process. Communicators meet through the
// coordinator's rendezvous under the epoch's token.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/shared_memory.h"
#include "ringmaster/v1/worker.pb.h"
#include "worker/execution_clocks.h"
#include "worker/executor.h"
#include "worker/gpu/device_executor.h"
#include "worker/rendezvous/net_address.h"
#include "worker/rendezvous/rendezvous_client.h"
#include "worker/worker_context.h"

namespace ringmaster {

// A GPU slot's device side and what a training process needs to share it (its welcome).
struct DeviceParts {
  std::unique_ptr<DeviceExecutor> device;  // null on a CPU slot
  std::string pci_bus_id;
  std::string arena_handle;
  std::vector<std::string> done_event_handles;
};

struct ExecutorSetup {
  const v1::JobAssignment& assignment;
  const WorkerContext& context;
  uint8_t* arena = nullptr;  // the epoch's shared arena (its size: DaemonOptions::arena_bytes)
  ArenaAllocator* outputs = nullptr;
  // The rendezvous keys the communicators set, published again after a coordinator restart.
  std::shared_ptr<RendezvousJournal> journal;
  LocalAddress address;  // where this host's data plane listens
  // GPU slots: the device side failed by itself (an NCCL error, a collective past its deadline).
  std::function<void(const absl::Status&)> on_device_failure;
  // Where the CPU communicators' time and connections are counted (null: nowhere).
  std::shared_ptr<ExecutionClocks> clocks;
};

struct ExecutorParts {
  std::unique_ptr<Executor> executor;
  // Declared by its owner before the engine that uses the executor, so destroyed after it.
  DeviceParts device;
};

// The executor for `setup.context.cuda_device` (< 0: the CPU's). A GPU slot's device setup error
// is returned as the plugin gave it.
absl::StatusOr<ExecutorParts> MakeExecutor(const ExecutorSetup& setup);

}  // namespace ringmaster
