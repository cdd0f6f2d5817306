// What a worker daemon is configured with (DaemonOptions, from its flags), and what each of its
// jobs' runners borrows from it (WorkerContext).
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tls.h"
#include "worker/rendezvous/net_address.h"

namespace ringmaster {

class CoordinatorChannels;
class CoordinatorSession;
class MetricsRegistry;
class ThreadList;
struct GpuPlugin;  // worker/gpu/plugin.h

struct DaemonOptions {
  std::string coordinator;  // host:port
  std::string device = "cpu";
  std::string host_name;    // default: gethostname()
  std::string socket_path;  // default: /tmp/ringmaster-worker-<pid>.sock
  // The socket's group, by name or number (mode 0660): processes of another user in it may
  // connect, but only the daemon's own user, root and `attach_uids` are welcomed. "": the
  // daemon's primary group.
  std::string socket_group;
  // Users besides the daemon's own and root whose processes may attach (e.g. the runAsUser of
  // Kubernetes training pods that attach to a root daemon).
  std::vector<uid_t> attach_uids;
  // The data plane's network interface (Gloo, NCCL's bootstrap); "": the one that holds the
  // address of the route to the coordinator.
  std::string iface;
  // How the daemon reaches the coordinator: mutual TLS with these files (a certificate of the
  // workers group), or plaintext when none is named.
  TlsFiles tls;
  size_t arena_bytes = size_t{1} << 30;
  absl::Duration stop_grace = absl::Seconds(5);
  absl::Duration collective_timeout = absl::Seconds(30);
  // A rank whose coordinator stays unreachable this long is stopped (its process terminated): its
  // job cannot end well without it. Until then the rank's process and communicators keep going,
  // and the session keeps retrying.
  absl::Duration coordinator_grace = absl::Minutes(5);
  std::string metrics_listen;  // "host:port" to serve /metrics on; empty: off
  // Where each launched rank gets a directory of its own (removed when the rank is done): its
  // code (the job's source archive unpacked) and its output directory (RINGMASTER_OUTPUT_DIR).
  // Default: $TMPDIR/ringmaster-ranks-<uid> (TMPDIR defaults to /tmp).
  std::string work_dir;
  bool record_metrics = true;  // false: the engine records nothing (to measure what metrics cost)
};

// The daemon's parts that a job's runner uses; all outlive every runner.
struct WorkerContext {
  const DaemonOptions* options = nullptr;
  // The coordinator's address, or its replicas' (following the leader): rendezvous, code, output.
  std::shared_ptr<CoordinatorChannels> channel;
  CoordinatorSession* session = nullptr;  // negotiation, rank updates, output
  MetricsRegistry* metrics = nullptr;     // null: the engine and relay record nothing
  int cuda_device = -1;                   // the GPU served, -1 for a CPU slot
  const GpuPlugin* gpu_plugin = nullptr;  // loaded for a GPU slot
  absl::Duration wall_clock_offset;       // fault injection: the reported wall clock's skew
  // Threads that must end before the daemon does (cleanups, terminations, republishing).
  ThreadList* finishers = nullptr;
  // The address the data plane listens on, found again while unknown.
  std::function<absl::StatusOr<LocalAddress>()> data_address;
};

}  // namespace ringmaster
