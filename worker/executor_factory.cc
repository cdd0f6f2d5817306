#include "worker/executor_factory.h"

#include "absl/strings/str_cat.h"
#include "worker/cpu/cpu_executor.h"
#include "worker/cpu/gloo_backend.h"
#include "worker/gpu/gpu_executor.h"
#ifdef RINGMASTER_HAVE_NCCL
#include "worker/gpu/plugin.h"
#endif

namespace ringmaster {
namespace {

CpuExecutorOptions CpuExecutorFor(const ExecutorSetup& setup) {
  const v1::JobAssignment& assignment = setup.assignment;
  const DaemonOptions& options = *setup.context.options;
  const v1::Job& spec = assignment.job();
  const v1::Knobs& knobs = spec.spec().knobs();
  CpuExecutorOptions cpu;
  cpu.rank = assignment.rank();
  cpu.size = spec.spec().np();
  cpu.arena = setup.arena;
  cpu.outputs = setup.outputs;
  // A Gloo communicator among `size` ranks meeting under `prefix`: the job's (one per index), or a
  // process set's (its members, under the set's key).
  auto gloo = [channel = setup.context.channel, assignment, iface = options.iface,
               hostname = setup.address.address, timeout = options.collective_timeout,
               journal = setup.journal, clocks = setup.clocks](
                  int gloo_rank, int size,
                  std::string prefix) -> absl::StatusOr<std::unique_ptr<Backend>> {
    GlooBackendOptions g;
    g.rank = gloo_rank;
    g.size = size;
    g.store = std::make_shared<RendezvousClient>(channel, assignment.job().id(), assignment.epoch(),
                                                 journal, assignment.rendezvous_token());
    g.prefix = std::move(prefix);
    g.iface = iface;
    g.hostname = hostname;
    g.timeout = timeout;
    if (clocks == nullptr) return CreateGlooBackend(std::move(g));
    // Its calls are the rank's network time; the sockets it connects, its links.
    const ExecutionClocks::Sockets before = ExecutionClocks::TcpSockets();
    absl::StatusOr<std::unique_ptr<Backend>> backend = CreateGlooBackend(std::move(g));
    if (!backend.ok()) return backend.status();
    clocks->Adopt(before);
    return std::make_unique<TimedBackend>(*std::move(backend), clocks);
  };
  cpu.make_backend = [gloo, rank = assignment.rank(), np = spec.spec().np()](int index) {
    return gloo(rank, np, absl::StrCat("gloo/", index, "/"));
  };
  cpu.make_set_backend = [gloo](const std::string& key, int set_rank, int set_size) {
    return gloo(set_rank, set_size, absl::StrCat("gloo/", key, "/"));
  };
  cpu.hierarchical_allreduce = knobs.hierarchical_allreduce();
  cpu.hierarchical_allgather = knobs.hierarchical_allgather();
  // Off under autotune, which scores what the coordinator negotiates.
  cpu.local_negotiation =
      (!knobs.has_local_negotiation() || knobs.local_negotiation()) && !knobs.autotune();
  if (!knobs.has_shm_allreduce() || knobs.shm_allreduce()) {
    cpu.make_host_group = [channel = setup.context.channel, assignment, journal = setup.journal,
                           host = options.host_name, timeout = options.collective_timeout]() {
      const v1::JobSpec& spec = assignment.job().spec();
      ShmGroupOptions o;
      o.rank = assignment.rank();
      o.size = spec.np();
      o.store =
          std::make_shared<RendezvousClient>(channel, assignment.job().id(), assignment.epoch(),
                                             journal, assignment.rendezvous_token());
      o.host = host;
      o.across_hosts =
          spec.knobs().hierarchical_allreduce() || spec.knobs().hierarchical_allgather();
      o.timeout = timeout;
      return ConnectShmGroup(std::move(o));
    };
  }
  return cpu;
}

absl::StatusOr<ExecutorParts> DeviceExecutorFor(const ExecutorSetup& setup) {
#ifdef RINGMASTER_HAVE_NCCL
  const v1::JobAssignment& assignment = setup.assignment;
  const DaemonOptions& options = *setup.context.options;
  GpuJobOptions g;
  g.device = setup.context.cuda_device;
  g.rank = assignment.rank();
  g.size = assignment.job().spec().np();
  g.arena_bytes = static_cast<int64_t>(options.arena_bytes);
  const std::string where =
      absl::StrCat("rank ", g.rank, " (", options.host_name, ", cuda:", g.device, ")");
  auto on_fail = setup.on_device_failure;
  const GpuPlugin* plugin = setup.context.gpu_plugin;
  auto nccl = [plugin, channel = setup.context.channel, assignment, where,
               timeout = options.collective_timeout, device = g.device, on_fail,
               journal = setup.journal](std::shared_ptr<std::atomic<bool>> cancelled,
                                        const std::string& prefix, int rank, int size, void* stream,
                                        const std::string& set) {
    NcclBackendOptions n;
    n.rank = rank;
    n.size = size;
    n.device = device;
    n.store = std::make_shared<RendezvousClient>(channel, assignment.job().id(), assignment.epoch(),
                                                 journal, assignment.rendezvous_token());
    n.prefix = prefix;
    n.where = set.empty() ? where : absl::StrCat(where, " in process set ", set);
    n.timeout = timeout;
    n.cancelled = std::move(cancelled);
    n.on_fail = on_fail;
    n.stream = stream;
    return plugin->create_backend(std::move(n));
  };
  g.make_backend = [nccl, rank = g.rank, size = g.size](std::shared_ptr<std::atomic<bool>> c) {
    return nccl(std::move(c), "nccl/0/", rank, size, nullptr, "");
  };
  g.make_set_backend = [nccl](std::shared_ptr<std::atomic<bool>> c, const std::string& key,
                              int set_rank, int set_size, void* stream) {
    return nccl(std::move(c), absl::StrCat("nccl/", key, "/"), set_rank, set_size, stream, key);
  };
  absl::StatusOr<GpuJobParts> gpu = plugin->create_job(std::move(g));
  if (!gpu.ok()) return gpu.status();
  ExecutorParts parts;
  parts.executor = std::make_unique<GpuExecutor>(gpu->job.get(), setup.outputs, g.rank, g.size);
  parts.device.pci_bus_id = std::move(gpu->pci_bus_id);
  parts.device.arena_handle = std::move(gpu->arena_handle);
  parts.device.done_event_handles = std::move(gpu->done_event_handles);
  parts.device.device = std::move(gpu->job);
  return parts;
#else
  (void)setup;
  return absl::FailedPreconditionError("this build has no CUDA/NCCL");
#endif
}

}  // namespace

absl::StatusOr<ExecutorParts> MakeExecutor(const ExecutorSetup& setup) {
  if (setup.context.cuda_device >= 0) return DeviceExecutorFor(setup);
  ExecutorParts parts;
  parts.executor = std::make_unique<CpuExecutor>(CpuExecutorFor(setup));
  return parts;
}

}  // namespace ringmaster
