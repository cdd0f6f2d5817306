// The worker daemon: one per GPU or CPU slot, long-lived, serving one job at a time. It keeps its
// coordinator session, and for each assigned rank creates the shared arena and the engine, launches
// the job's command (or serves a process that attaches to its socket), forwards the process's
// output, reports its exit, and cleans everything up when the job ends.
//
// Thread-safe: mu_ guards the current job; coordinator messages arrive on the session thread,
// training-process requests on local-server threads, the rank's exit on a waiter thread.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/coordinator_channels.h"
#include "common/metrics_server.h"
#include "common/shared_memory.h"
#include "common/thread_list.h"
#include "common/tls.h"
#include "grpcpp/channel.h"
#include "worker/child_process.h"
#include "worker/gpu/device_executor.h"
#include "worker/local/local_server.h"
#include "worker/negotiation/coordinator_session.h"
#include "worker/negotiation/engine.h"
#include "worker/negotiation/negotiation_relay.h"
#include "worker/negotiation/session_ledger.h"
#include "worker/rendezvous/net_address.h"
#include "worker/rendezvous/rendezvous_client.h"

namespace ringmaster {

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

class Daemon : public CoordinatorSession::Listener, public LocalServer::Handler {
 public:
  explicit Daemon(DaemonOptions options);
  ~Daemon() override;

  // Opens the local socket and the metrics endpoint, and starts the coordinator session.
  absl::Status Start();
  // The metrics port (0 when not serving metrics).
  int metrics_port() const { return metrics_server_ ? metrics_server_->port() : 0; }
  // Blocks until Shutdown() or a coordinator `shutdown`; then stops the job and everything else.
  void Run();
  void Shutdown();

  // CoordinatorSession::Listener
  void OnMessage(const v1::CoordinatorMessage& message) override;
  void OnSessionLost(const absl::Status& status, bool reregistered) override;
  void OnSessionOpen(v1::SessionOpen* open) override;

  // LocalServer::Handler
  absl::StatusOr<Welcome> OnHello(const v1::LocalHello& hello,
                                  const PeerCredentials& peer) override;
  void OnEnqueue(const v1::LocalWelcome* welcome, const v1::LocalEnqueue& enqueue,
                 std::function<void(const v1::LocalCompletion&)> reply) override;
  void OnRelease(const v1::LocalWelcome* welcome, const v1::LocalRelease& release) override;
  absl::Status OnReadyEvents(const v1::LocalReadyEvents& events) override;
  void OnDisconnect(const v1::LocalWelcome* welcome) override;

 private:
  // A rank's process and directory. An elastic job's rank keeps them across its epochs: each new
  // epoch's Job shares its predecessor's.
  struct Process {
    // Held while the process is started (child set) and when a stop looks for it: a stop that
    // comes while the rank's code is being fetched finds no process, and none starts after it.
    absl::Mutex launch_mu;
    std::unique_ptr<ChildProcess> child;
    std::atomic<pid_t> child_pid{0};
    // A launched rank's directory under DaemonOptions::work_dir ("": none made yet).
    std::string dir;  // child's, once started (OnHello reads it unlocked)
    std::thread waiter;
    // The launched process exited: a new epoch's assignment starts a new one (after cleanup).
    std::atomic<bool> exited{false};
    // Whose output the process's output is (the current epoch's job, epoch and rank), and the
    // number of its last chunk in that epoch.
    absl::Mutex output_mu;
    std::string output_job ABSL_GUARDED_BY(output_mu);
    int64_t output_epoch ABSL_GUARDED_BY(output_mu) = 0;
    int32_t output_rank ABSL_GUARDED_BY(output_mu) = 0;
    uint64_t output_seq ABSL_GUARDED_BY(output_mu) = 0;
  };

  // One epoch of the rank this daemon serves.
  struct Job {
    v1::JobAssignment assignment;
    // GPU slots: the device side (arena, events, NCCL); declared before the engine, which uses it,
    // so it is destroyed after it.
    std::unique_ptr<DeviceExecutor> gpu;
    std::string device_arena_handle;
    std::string device_pci_bus_id;
    std::vector<std::string> done_event_handles;
    std::unique_ptr<SharedMemory> arena;
    std::unique_ptr<ArenaAllocator> outputs;
    // The rendezvous keys this rank set, published again when the session reopens.
    std::shared_ptr<RendezvousJournal> rendezvous = std::make_shared<RendezvousJournal>();
    // The reliable session's record of this rank (before the engine, which sends through it).
    std::unique_ptr<SessionLedger> ledger;
    // Held while a batch is numbered and sent, and while a resume re-sends: batches reach the
    // coordinator in their order (it drops one numbered below what it has).
    absl::Mutex send_mu;
    // Held while lists are taken from the ledger and handed to the engine: they come on the
    // session's thread and on a relay link's, and must reach the engine in their order.
    absl::Mutex apply_mu;
    std::unique_ptr<Engine> engine;
    std::shared_ptr<Process> proc = std::make_shared<Process>();
    std::atomic<bool> started{false};
    std::atomic<bool> stopped{false};
    // Elastic jobs: this epoch was ended (StopJob of the epoch: too few ranks left) while the
    // process stays for the next; the rank asked the coordinator for a new epoch (RankReset, once);
    // workers were added to the job (HostsUpdated), which completions tell the process.
    std::atomic<bool> epoch_ended{false};
    std::atomic<bool> reset_sent{false};
    std::shared_ptr<std::atomic<bool>> hosts_updated = std::make_shared<std::atomic<bool>>(false);
    // The training process connected to this rank (its pid; -1 if it gave none; 0: none) and its
    // open connections (a process may reconnect before its old connection's end is seen). One
    // process per rank: a second one would share the arena (and, on a GPU, replace the ready
    // events).
    absl::Mutex attach_mu;
    int attached_pid ABSL_GUARDED_BY(attach_mu) = 0;
    int attached_connections ABSL_GUARDED_BY(attach_mu) = 0;
    bool closing ABSL_GUARDED_BY(attach_mu) = false;  // FinishJob is releasing it
    // Set (under the daemon's mu_) once arena, outputs and engine exist; until then the job is
    // reserved but not served, and a stop is only requested.
    bool ready = false;
    bool stop_requested = false;
    // The negotiation relay (knob negotiation_relay): this daemon's hub when it relays for its
    // host's other ranks, or its link to the daemon that does. Set before the engine starts and
    // never reset; made inert (EndRelay) when the rank stops, its epoch ends or it finishes.
    // Declared last, so destroyed first: their threads (a link's hands lists to the engine, and
    // reads proc and stopped) end while everything else still exists.
    std::unique_ptr<RelayHub> relay_hub;
    std::unique_ptr<RelayLink> relay_link;

    bool elastic() const {
      return assignment.job().spec().min_np() > 0 || assignment.job().spec().max_np() > 0;
    }
  };

  void StartJob(const v1::JobAssignment& assignment);
  // Lists from the coordinator (or the relay) for `job`'s rank: through its ledger, in order, to
  // its engine.
  static void ApplyLists(Job& job, v1::ResponseList list);
  // Sets up `job`'s part in its host's negotiation relay, if it has one.
  void StartRelay(const std::shared_ptr<Job>& job);
  // The rank is done with its relay: a hub closes its peers' links (they resume on their own
  // sessions unless their ranks are done too), a link closes quietly.
  static void EndRelay(Job& job, const std::string& why);
  // A launched rank, on its waiter thread: makes its directory (fetching and unpacking the job's
  // code), starts its process, waits for it, sends what it left in its output directory, and
  // reports its exit.
  void RunRank(std::shared_ptr<Job> job);
  // The rest of RunRank once the process exited: `job` is the epoch it exited in.
  void RunRankExited(const std::shared_ptr<Job>& job, const ChildExit& exit);
  // The rank's directory: <work_dir>/<job>-<epoch>-rank-<rank>-<pid>/{code,output}.
  absl::Status PrepareRankDir(Job& job);
  // UNAVAILABLE-free ABORTED when the job was stopped before the process could start.
  absl::Status LaunchChild(const std::shared_ptr<Job>& job);
  // Stops the job's rank (abort pending ops, terminate the process) because of `reason`. `epoch`
  // > 0: that epoch only; an elastic job's process then stays for the next epoch.
  void StopJob(const std::string& job_id, const absl::Status& reason, int64_t epoch = 0);
  // Stops `job`'s rank (StopJob once the job is found).
  void StopRank(const std::shared_ptr<Job>& job, const absl::Status& reason);
  // StartJob could not build `job`: reported EXITED with `why`; finished, or, when it took over an
  // elastic job's running process, that process stopped (its waiter finishes the rank).
  void FailStart(const std::shared_ptr<Job>& job, const std::string& why);
  // Elastic jobs: ends epoch `job` (its pending operations fail with `reason`, its engine and arena
  // go) but not its process, which the next epoch's Job has.
  void EndEpoch(const std::shared_ptr<Job>& job, const absl::Status& reason);
  // Elastic jobs: asks the coordinator for an epoch after the job's current one (once per epoch).
  void RequestReset(Job& job, const std::string& why);
  // Releases the job's resources once its rank is done. Runs on a thread of its own.
  void FinishJob(std::shared_ptr<Job> job);
  // GPU slots: the job's device side (GpuJob) into `job`; the engine options point at it.
  absl::Status StartDevice(Job& job, EngineOptions& e);
  // `failed`: the rank's data plane failed while its process runs (`text` says why).
  void SendRankUpdate(const Job& job, v1::RankState state, int exit_code, const std::string& text,
                      bool failed = false);
  std::shared_ptr<Job> CurrentJob();
  // The current job once it is ready to serve (arena and engine built), else null.
  std::shared_ptr<Job> ServingJob();
  // The address the data plane listens on (see net_address.h); found again while unknown (a
  // coordinator name that did not resolve at start).
  absl::StatusOr<LocalAddress> DataAddress();

  const DaemonOptions options_;
  int cuda_device_ = -1;                   // the GPU served (--device cuda:N), -1 for a CPU slot
  const GpuPlugin* gpu_plugin_ = nullptr;  // loaded at start for a GPU slot; lives as the process
  MetricsRegistry metrics_;
  std::unique_ptr<MetricsServer> metrics_server_;
  // The coordinator's address, or its replicas' (following the leader).
  std::shared_ptr<CoordinatorChannels> channel_;
  std::unique_ptr<CoordinatorSession> session_;
  std::atomic<bool> session_started_{false};  // session_ is set (read by /readyz)
  std::unique_ptr<LocalServer> local_;

  absl::Mutex mu_;
  std::shared_ptr<Job> job_ ABSL_GUARDED_BY(mu_);
  // An assignment that arrived while the previous job was still being cleaned up.
  std::optional<v1::JobAssignment> queued_ ABSL_GUARDED_BY(mu_);
  // The last job this daemon ran to its end ("JOB@EPOCH"): an assignment of it sent again (a
  // coordinator that had not heard of its end yet) does not start it twice.
  std::string finished_ ABSL_GUARDED_BY(mu_);
  std::optional<LocalAddress> data_address_ ABSL_GUARDED_BY(mu_);

  // The rank of an attached job (JobSpec.attached) that a process waiting at the socket claimed
  // through this daemon, until the job is assigned. One at a time: a daemon serves one rank.
  struct Claim {
    std::string job_name;
    int32_t rank = -1;
    absl::Time sent = absl::InfinitePast();
    absl::Status refusal;  // the coordinator's ClaimRefused, if it answered one
  };
  // Claims `rank` of job `job_name` for a process at the socket (or says how the claim stands):
  // UNAVAILABLE while the job waits for its ranks (the client retries), FAILED_PRECONDITION when
  // the coordinator refused the claim for good.
  absl::Status ClaimRank(const std::string& job_name, int32_t rank);
  absl::Mutex claim_mu_ ABSL_ACQUIRED_AFTER(mu_);
  Claim claim_ ABSL_GUARDED_BY(claim_mu_);
  ThreadList finishers_;  // one per finished job
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  // Stops the current job's rank once the coordinator has been unreachable for the grace.
  void CheckCoordinatorGrace();
  absl::Time unreachable_since_ = absl::InfiniteFuture();  // Run()'s thread only
  // RINGMASTER_FAULT_CLOCK_OFFSET_SECONDS: set at Start(), read after.
  absl::Duration wall_clock_offset_;
};

}  // namespace ringmaster
