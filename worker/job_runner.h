// One epoch of the rank a worker daemon serves, from its assignment to its end. The runner builds
// what the rank needs (the shared arena, the engine with its CPU or GPU executor, its part in the
// host's negotiation relay), launches the rank's process (RankProcess) or waits for one to attach,
// carries the coordinator's lists to the engine through the session's ledger, and stops, ends an
// elastic epoch, or finishes and releases everything. The daemon (its Owner) keeps the registry of
// runners and routes messages to them; the local API serves the attached process from one.
//
// Thread-safe: coordinator messages come on the session's thread, the local API's calls on its
// connections' threads, the process's exit on the waiter thread. state_mu_ guards the few fields
// that change after the build (ready, a stop asked for before it); send_mu_ and apply_mu_ order
// what goes to the coordinator and to the engine. The build's parts (arena, engine, relay) are set
// once in Start() before ready() and never reset until the runner is destroyed.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/shared_memory.h"
#include "ringmaster/v1/worker.pb.h"
#include "worker/execution_clocks.h"
#include "worker/executor_factory.h"
#include "worker/local/rank_attachment.h"
#include "worker/negotiation/engine.h"
#include "worker/negotiation/negotiation_relay.h"
#include "worker/negotiation/session_ledger.h"
#include "worker/rank_process.h"
#include "worker/rendezvous/rendezvous_client.h"
#include "worker/worker_context.h"

namespace ringmaster {

class JobRunner : public std::enable_shared_from_this<JobRunner> {
 public:
  // The registry the runner belongs to (the daemon); it outlives every runner.
  class Owner {
   public:
    virtual ~Owner() = default;
    // The runner currently registered (any epoch, built or not), or null.
    virtual std::shared_ptr<JobRunner> Current() = 0;
    // `runner`'s rank is cleaned up: the owner forgets it and starts what waited for the slot.
    virtual void Finished(const std::shared_ptr<JobRunner>& runner) = 0;
    // Ends every connection of the local API (the rank's arena is going).
    virtual void DisconnectLocal() = 0;
  };

  // `process`: an elastic job's rank process that goes on from the previous epoch; null: a new one.
  JobRunner(v1::JobAssignment assignment, const WorkerContext& context, Owner& owner,
            std::shared_ptr<RankProcess> process);
  ~JobRunner();

  // Builds the rank (arena, engine, relay) and starts it: launches the command, or waits for a
  // process to attach. `previous`: the elastic job's epoch whose process this one takes over; it
  // ends first. A build that fails reports the rank EXITED with why and finishes.
  void Start(const std::shared_ptr<JobRunner>& previous);

  const v1::JobAssignment& assignment() const { return assignment_; }
  const std::string& job_id() const { return assignment_.job().id(); }
  int64_t epoch() const { return assignment_.epoch(); }
  int32_t rank() const { return assignment_.rank(); }
  bool elastic() const;

  // Built: arena, outputs and engine exist (only then does it serve lists and processes).
  bool ready() const;
  bool stopped() const { return stopped_.load(); }
  // Until the runner is built: records that a stop was asked for (Start() stops the rank as soon
  // as it is built) and returns true. Built: false, nothing recorded.
  bool DeferStop();
  // Whether a next epoch can take over this rank's process: built, not stopped, and its launched
  // process still running.
  bool CanHandOverProcess() const;
  const std::shared_ptr<RankProcess>& process() const { return process_; }

  // The coordinator's messages for this rank.
  void ApplyLists(v1::ResponseList list);
  // A relaying rank's message: each peer's list to its link, its own applied.
  void DeliverRelayed(const v1::RelayedResponses& relayed);
  // The session resumed this rank: what the coordinator had not received is sent again, on the
  // rank's own session from now on.
  void Resumed(const v1::SessionResumed& resumed);
  // A session opens: the rank's resume point, and its rendezvous keys set again (a restarted
  // coordinator lost them).
  void FillResume(v1::SessionOpen* open);
  // The session ended: what the engine sends waits for the next resume; a relay's peers resume on
  // their own sessions.
  void SessionLost(const absl::Status& status);
  // Elastic: workers were added to the job; completions tell the process to reset.
  void MarkHostsUpdated() { hosts_updated_->store(true); }

  // Stops the rank for `reason` (the coordinator's StopJob of `epoch`, 0: of the job): pending
  // operations fail with it and the process is terminated. Before the build: deferred. An elastic
  // job's epoch that ends (too few ranks for a new one) keeps its process waiting for the next.
  void StopFor(const absl::Status& reason, int64_t epoch);
  // Stops the rank (once): relay ended, rendezvous cancelled, engine aborted with `reason`, the
  // process terminated (then its waiter finishes the rank), or, without one, finished at once.
  void Stop(const absl::Status& reason);
  // Elastic: asks the coordinator for an epoch after this one (once per epoch).
  void RequestReset(const std::string& why);
  // `failed`: the rank's data plane failed while its process runs (`text` says why).
  void SendRankUpdate(v1::RankState state, int exit_code, const std::string& text,
                      bool failed = false);
  // Releases the rank's resources (engine, relay, arena, directory) on a thread of its own, then
  // tells the owner.
  void Finish();

  // For the local API: the attached process, the arena it maps, the outputs it frees, the engine it
  // enqueues on, the GPU side it shares, and whether the rank was reported STARTED.
  RankAttachment& attachment() { return attachment_; }
  const SharedMemory& arena() const { return *arena_; }
  size_t client_bytes() const;
  ArenaAllocator& outputs() { return *outputs_; }
  Engine& engine() { return *engine_; }
  // GPU slots: the device side (null on a CPU slot) and what a process needs to share it.
  DeviceExecutor* gpu() { return device_.device.get(); }
  const DeviceParts& device() const { return device_; }
  int cuda_device() const { return context_.cuda_device; }
  bool started() const { return started_.load(); }
  // Marks the rank STARTED; true if it was already.
  bool MarkStarted() { return started_.exchange(true); }
  // Marks the rank stopped; true if it was already.
  bool MarkStopped() { return stopped_.exchange(true); }
  const std::shared_ptr<std::atomic<bool>>& hosts_updated() const { return hosts_updated_; }

 private:
  // Start()'s parts: the epoch's arena, the engine's options with its hooks to the coordinator, and
  // the relay.
  absl::Status BuildArena();
  EngineOptions EngineOptionsFor();
  void StartRelay();
  void StartRelayHub(const RelayPlan& plan, std::shared_ptr<RendezvousClient> store);
  void StartRelayLink(const RelayPlan& plan, std::shared_ptr<RendezvousClient> store);
  // What the rank's collectives spend their time on, to the coordinator (RankExecution).
  void StartReporter();
  // The rank is done with its relay: a hub closes its peers' links, a link closes quietly.
  void EndRelay(const std::string& why);
  // The build failed: reported EXITED with `why`; finished, or, when it took over an elastic job's
  // running process, that process stopped (its waiter finishes the rank).
  void FailStart(const std::string& why);
  // Elastic: ends this epoch (operations fail with `reason`, engine and arena go) but not its
  // process, which the next epoch's runner has.
  void HandOver(const absl::Status& reason);
  // Elastic: this epoch ended (too few ranks left for a new one); its process waits in its reset.
  void EndEpochWaiting(const absl::Status& reason);
  // A rank the daemon launches, on the process's waiter thread: makes its directory, starts the
  // process, waits for it and hands its exit to the epoch current then.
  static void RunRank(std::shared_ptr<JobRunner> first);
  absl::Status Launch();
  // The process exited in this epoch: its output files sent, peers told why, EXITED, finished.
  void Exited(const ChildExit& exit);
  // Finish()'s work, on a finisher thread.
  void Release();

  const v1::JobAssignment assignment_;
  const WorkerContext context_;
  const DaemonOptions& options_;
  Owner& owner_;
  // GPU slots: the device side (arena, events, NCCL); declared before the engine, which uses it,
  // so it is destroyed after it.
  DeviceParts device_;
  std::unique_ptr<SharedMemory> arena_;
  std::unique_ptr<ArenaAllocator> outputs_;
  // The rendezvous keys this rank set, published again when the session reopens.
  std::shared_ptr<RendezvousJournal> rendezvous_ = std::make_shared<RendezvousJournal>();
  // The reliable session's record of this rank (before the engine, which sends through it).
  std::unique_ptr<SessionLedger> ledger_;
  // Held while a batch is numbered and sent, and while a resume re-sends: batches reach the
  // coordinator in their order (it drops one numbered below what it has).
  absl::Mutex send_mu_;
  // Held while lists are taken from the ledger and handed to the engine: they come on the
  // session's thread and on a relay link's, and must reach the engine in their order.
  absl::Mutex apply_mu_;
  std::unique_ptr<Engine> engine_;
  // What the engine and the communicators count, and what sends it twice a second.
  static constexpr absl::Duration kReportEvery = absl::Milliseconds(500);
  std::shared_ptr<ExecutionClocks> clocks_ = std::make_shared<ExecutionClocks>();
  std::unique_ptr<ExecutionReporter> reporter_;
  std::shared_ptr<RankProcess> process_;
  RankAttachment attachment_;
  std::atomic<bool> started_{false};
  std::atomic<bool> stopped_{false};
  // Elastic jobs: this epoch was ended while the process stays for the next; the rank asked the
  // coordinator for a new epoch (RankReset, once); workers were added to the job.
  std::atomic<bool> epoch_ended_{false};
  std::atomic<bool> reset_sent_{false};
  std::shared_ptr<std::atomic<bool>> hosts_updated_ = std::make_shared<std::atomic<bool>>(false);
  mutable absl::Mutex state_mu_;
  bool ready_ ABSL_GUARDED_BY(state_mu_) = false;
  bool stop_requested_ ABSL_GUARDED_BY(state_mu_) = false;
  // The negotiation relay (knob negotiation_relay): this rank's hub when it relays for its host's
  // other ranks, or its link to the rank that does. Set before the engine starts and never reset;
  // made inert (EndRelay) when the rank stops, its epoch ends or it finishes. Declared last, so
  // destroyed first: their threads (a link's hands lists to the engine) end while everything else
  // still exists.
  std::unique_ptr<RelayHub> relay_hub_;
  std::unique_ptr<RelayLink> relay_link_;
};

}  // namespace ringmaster
