// The GPU data plane as a module the worker daemon loads at run time (libringmaster_cuda.so:
// GpuJob, the NCCL backend, the pack kernels). Only the module links CUDA's runtime and NCCL, so
// the daemon (and the package holding it) runs on machines without them; `--device cuda:N` loads
// the module, and a machine without CUDA or NCCL gets an error naming the library that is missing.
//
// The module and the daemon come from one build: the table's types are this build's C++ types.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/gpu/gpu_job.h"
#include "worker/gpu/nccl_backend.h"

namespace ringmaster {

// A GPU job as the daemon holds it: the executor (a GpuJob, only ever used through its interface
// here: the daemon does not link GpuJob's code) and what training processes need to attach.
struct GpuJobParts {
  std::unique_ptr<DeviceExecutor> job;
  std::string pci_bus_id;
  std::string arena_handle;
  std::vector<std::string> done_event_handles;
};

struct GpuPlugin {
  // The build that made the module: a module of another build is refused.
  const char* build_id;
  absl::Status (*check_device)(int device);
  absl::StatusOr<GpuJobParts> (*create_job)(GpuJobOptions options);
  absl::StatusOr<std::unique_ptr<NcclBackend>> (*create_backend)(NcclBackendOptions options);
};

// The module's one exported symbol.
#define RINGMASTER_GPU_PLUGIN_SYMBOL "ringmaster_gpu_plugin"
extern "C" const GpuPlugin* ringmaster_gpu_plugin();

// Loads the module once per process: the file named by RINGMASTER_CUDA_PLUGIN, else
// libringmaster_cuda.so in ../lib/ringmaster/ beside the running executable (the build tree's and
// the installed layout alike). FAILED_PRECONDITION naming the file and the loader's reason (e.g.
// "libnccl.so.2: cannot open shared object file") when it cannot be loaded. Thread-safe.
absl::StatusOr<const GpuPlugin*> LoadGpuPlugin();

}  // namespace ringmaster
