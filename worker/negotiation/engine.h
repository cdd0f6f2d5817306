// The engine of one rank of one job: collects the training process's enqueued collectives, sends
// them to the coordinator in at most one batch per cycle (by response-cache id once cached), and
// hands the coordinator's responses, in the order given, to its executor (executor.h: Gloo on the
// CPU, NCCL on a GPU), then completes each operation. Errors reach exactly the operations
// concerned.
//
// A response list of a new cache generation (a restarted coordinator resumed the job) makes the
// engine forget its response cache and send every request not yet answered again, in full: the new
// coordinator negotiates from scratch what the ranks still wait for.
//
// The engine works on the project's own types (common/negotiation_types.h and the structs below);
// the daemon converts the local socket's and the session's protobuf messages at its edges
// (worker/engine_wire.h).
//
// Local negotiation: where the executor offers it (one host, shared memory: local_rounds.h), a lone
// cached allreduce, with nothing else awaiting a response, is negotiated with the job's other
// ranks through shared memory; whatever that round cannot settle goes to the coordinator.
//
// Thread-safe: Enqueue/OnResponses/Abort may be called from any thread; one engine thread owns the
// executor and executes collectives with mu_ released.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "common/negotiation_types.h"
#include "worker/cpu/local_rounds.h"
#include "worker/executor.h"
#include "worker/negotiation/engine_metrics.h"
#include "worker/negotiation/worker_cache.h"

namespace ringmaster {

class ExecutionClocks;  // worker/execution_clocks.h

// One collective the training process enqueued.
struct LocalOp {
  uint64_t handle = 0;  // the client's, unique among its operations in flight
  TensorRequest request;
  int64_t offset = 0;       // where the tensor's bytes are in the arena
  int32_t ready_event = 0;  // GPU: the client's event to wait for (1-based; 0: the data is ready)
  // Allreduce on a CPU slot with direct access: the tensor lives at `address` in process `pid`
  // (read and written there with process_vm_readv/writev; `offset` is ignored). 0: in the arena.
  uint64_t address = 0;
  int32_t pid = 0;
};

// How an operation ended.
struct OpResult {
  absl::Status status;
  int64_t output_offset = 0;  // allgather: the output the daemon allocated in the arena
  std::vector<int64_t> output_shape;
  int32_t last_joined_rank = 0;  // join
  int32_t done_event = 0;        // GPU: recorded once the result is in place (1-based; 0: none)
};

// One negotiation cycle's response list, as this rank applies it: in cycle order and once each (the
// session below the engine sees to that).
struct RankCycle {
  // The response cache's generation; a new one means the coordinator negotiates afresh.
  uint64_t cache_generation = 0;
  // Negotiation parameters in force (they change under autotune). cycle_time_ms 0: unchanged.
  int64_t fusion_threshold_bytes = 0;
  double cycle_time_ms = 0;
  std::vector<CacheAssignment> cache_assignments;  // applied before the responses
  std::vector<uint32_t> evicted_ids;
  std::vector<uint32_t> resend_ids;   // ids of this rank's to send again in full
  std::vector<Response> rank_errors;  // kError responses for this rank's requests alone
  std::vector<Response> responses;    // the same on every rank, executed in this order
};

struct EngineOptions {
  std::string job_id;
  int64_t epoch = 0;
  int rank = 0;
  int size = 1;
  std::string host;
  size_t arena_bytes = 0;  // enqueued tensors must lie in the arena
  // Requests go out at most once per cycle; response lists may change it (autotune).
  absl::Duration cycle_time = absl::Milliseconds(1);
  // What cycles are measured on (borrowed). A FakeClock moves the engine's cycles in tests: the
  // engine looks at the clock at least every kClockPoll of real time.
  Clock* clock = Clock::Real();
  // Report what each response's execution spent where (ExecutionSpan messages), for the timeline.
  bool timeline = false;
  // Added to the wall-clock times it reports (fault injection: a host whose clock is off).
  absl::Duration wall_clock_offset;
  // Executes the collectives (CpuExecutor, GpuExecutor); set up on the engine thread when it
  // starts. Null: every collective fails (no communicator).
  std::unique_ptr<Executor> executor;
  // Send a request batch (job, epoch, rank and cache generation filled in; the session numbers it)
  // and an executed response's timeline span (with the worker's clock when sent) to the
  // coordinator. Must not block for long.
  std::function<void(const RequestBatch&)> send_requests;
  std::function<void(const ExecutionSpan&, int64_t sent_unix_us)> send_span;
  // Where the engine's series go (borrowed), labelled job, rank and host. Null: nothing is recorded
  // (the hot path does no metrics work at all; used to measure what metrics cost).
  MetricsRegistry* metrics = nullptr;
  // Most operations of the training process in flight at once (enqueued, not yet done); more are
  // refused, RESOURCE_EXHAUSTED, until some complete. A bound on what a process can make its
  // daemon hold; Horovod has none, a model has some hundreds of tensors in flight.
  size_t max_in_flight = kDefaultMaxInFlight;
  static constexpr size_t kDefaultMaxInFlight = 65536;
  // Where each executed response's time is added, for the coordinator's "who is slow" (null:
  // nowhere).
  std::shared_ptr<ExecutionClocks> clocks;
};

class Engine {
 public:
  static constexpr absl::Duration kClockPoll = absl::Milliseconds(50);

  using Done = std::function<void(const OpResult&)>;

  explicit Engine(EngineOptions options);
  ~Engine();  // Stop()s

  void Start();

  // Queues one collective; `done` is called exactly once (from the engine thread, or from the
  // caller for an immediate rejection).
  void Enqueue(LocalOp op, Done done);

  // A response list from the coordinator for this job.
  void OnResponses(RankCycle cycle);

  // Fails every pending and future operation with `status` (job stopped, peer lost).
  void Abort(const absl::Status& status);

  // Aborts (with CANCELLED) what is pending and joins the engine thread.
  void Stop();
  // Stop(), waiting at most `timeout` for the engine thread: false when it is still busy (a
  // communicator setup in a connect that cannot be cancelled, bounded by the collective timeout);
  // a later Stop() joins it.
  bool StopWithin(absl::Duration timeout);

 private:
  struct Op {
    LocalOp local;
    Done done;
  };

  // A response list and when it arrived.
  struct Arrived {
    RankCycle cycle;
    absl::Time time;
  };

  void Loop();
  // An empty batch of this rank's, in the current cache generation.
  RequestBatch NewBatch() const;
  void SendBatch(const std::vector<TensorRequest>& requests);
  // Every batch for the coordinator goes through here: no local round completes at this point.
  // It carries the cache ids used in local rounds since the last one (RequestBatch.used_ids).
  void SendToCoordinator(RequestBatch batch);
  // Negotiates `request`, the rank's only collective in flight, in a local round; false when it
  // must go to the coordinator (not eligible, or the round was diverted).
  bool TryLocalRound(const TensorRequest& request);
  LocalPoint Point() const { return {lists_processed_, rounds_completed_}; }
  // Wakes a local round's wait: the engine has more work.
  void WakeRound();
  void Process(RankCycle& cycle, absl::Time arrived);
  // A list of a new cache generation: forget the cache, queue every unanswered request again.
  void Renegotiate(uint64_t generation);
  void Execute(const Response& response, const std::vector<std::string>& names,
               ExecutionTrace& trace);
  // The response as the executor runs it, on this rank's tensors (nullptr: this rank has none).
  static Collective ToCollective(const Response& r, const std::vector<Op*>& ops);
  // Reports the executed response's activities for the timeline (when the job has one).
  void SendSpan(const Response& r, const std::vector<std::string>& names,
                const ExecutionTrace& trace);
  // Removes the named ops from the table (nullptr for names this rank does not have, e.g. joined).
  std::vector<Op*> Take(const std::vector<std::string>& names) ABSL_LOCKS_EXCLUDED(mu_);
  void Complete(Op* op, const absl::Status& status, OpResult result = {});
  std::string RankName() const;

  // Observes a successfully executed response. Engine thread only.
  void Record(const Response& r, const std::vector<Op*>& ops, absl::Duration took);

  const EngineOptions options_;
  EngineMetrics metrics_;
  Executor* const executor_;      // options_.executor; its Abort is called from any thread
  absl::Status setup_status_;     // engine thread only: how the executor's Setup went
  bool executor_ready_ = false;   // engine thread only
  int64_t fusion_threshold_ = 0;  // engine thread only: as the last response list said
  WorkerCache cache_;             // engine thread only
  uint64_t generation_ = 0;       // engine thread only: the cache's generation
  // Local negotiation (engine thread only): the executor's rounds (null: none), and this rank's
  // point: response lists processed, rounds completed.
  LocalRounds* rounds_ = nullptr;
  uint64_t lists_processed_ = 0;
  uint64_t rounds_completed_ = 0;
  uint64_t rounds_diverted_ = 0;
  static constexpr size_t kMaxUsedIds = 1024;  // the coordinator's bound
  std::vector<uint32_t> used_ids_;             // completed locally since the last batch
  std::atomic<bool> in_round_{false};          // the engine thread waits in a local round

  bool Stopping() ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Op>> ops_ ABSL_GUARDED_BY(mu_);
  std::vector<TensorRequest> unsent_ ABSL_GUARDED_BY(mu_);  // copies: ops may be aborted
  absl::Time last_sent_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::deque<Arrived> responses_ ABSL_GUARDED_BY(mu_);
  absl::Duration cycle_time_ ABSL_GUARDED_BY(mu_);
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool joined_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
  absl::Notification loop_done_;  // the engine thread has left Loop()
  absl::Mutex join_mu_;           // one joiner at a time
};

}  // namespace ringmaster
