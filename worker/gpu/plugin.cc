// The module's side of plugin.h: its one exported entry point (built into libringmaster_cuda.so).
#include "worker/gpu/plugin.h"

namespace ringmaster {
namespace {

absl::StatusOr<GpuJobParts> CreateJob(GpuJobOptions options) {
  absl::StatusOr<std::unique_ptr<GpuJob>> job = GpuJob::Create(std::move(options));
  if (!job.ok()) return job.status();
  GpuJobParts parts;
  parts.pci_bus_id = (*job)->pci_bus_id();
  parts.arena_handle = (*job)->arena_handle();
  parts.done_event_handles = (*job)->done_event_handles();
  parts.job = *std::move(job);
  return parts;
}

}  // namespace
}  // namespace ringmaster

extern "C" __attribute__((visibility("default"))) const ringmaster::GpuPlugin*
ringmaster_gpu_plugin() {
  static const ringmaster::GpuPlugin plugin{RINGMASTER_BUILD_ID, &ringmaster::CheckCudaDevice,
                                            &ringmaster::CreateJob, &ringmaster::CreateNcclBackend};
  return &plugin;
}
