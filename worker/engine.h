// The engine of one rank of one job: collects the training process's enqueued collectives, sends
// them to the coordinator in at most one batch per cycle (by response-cache id once cached), and
// executes the coordinator's responses in the order given — pack into the fusion buffer (skipped
// when the tensors are already contiguous in the arena), prescale, collective, postscale/average,
// unpack — then completes each operation. Errors reach exactly the operations concerned.
//
// Thread-safe: Enqueue/OnResponses/Abort may be called from any thread; one engine thread owns the
// backend and executes collectives with mu_ released.
#pragma once

#include <condition_variable>
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
#include "absl/time/time.h"
#include "common/metrics.h"
#include "common/shared_memory.h"
#include "ringmaster/v1/local.pb.h"
#include "ringmaster/v1/worker.pb.h"
#include "worker/backend.h"
#include "worker/device_executor.h"
#include "worker/worker_cache.h"

namespace ringmaster {

struct EngineOptions {
  std::string job_id;
  int64_t epoch = 0;
  int rank = 0;
  int size = 1;
  std::string host;
  uint8_t* arena = nullptr;  // borrowed; outlives the engine
  size_t arena_bytes = 0;
  ArenaAllocator* outputs = nullptr;  // borrowed: where allgather outputs are allocated
  // Requests go out at most once per cycle; response lists may change it (autotune).
  absl::Duration cycle_time = absl::Milliseconds(1);
  // Report what each response's execution spent where (ExecutionSpan messages), for the timeline.
  bool timeline = false;
  // Creates communicator `index` (rendezvous included); called on the engine thread for 0 ..
  // communicators-1. Large allreduces are split across the communicators and run concurrently, so
  // the reduction arithmetic uses several cores (as NCCL's channels and PyTorch's Gloo threads do).
  std::function<absl::StatusOr<std::unique_ptr<Backend>>(int index)> make_backend;
  // GPU ranks: collectives run here instead (borrowed; outlives the engine), on tensors in the
  // device arena (`arena` is then the device arena's base, never dereferenced on the host).
  DeviceExecutor* device = nullptr;
  int communicators = 2;
  // Allreduces smaller than this use communicator 0 alone.
  int64_t split_bytes = int64_t{4} << 20;
  // Sends a message to the coordinator on the worker's session. Must not block for long.
  std::function<void(const v1::WorkerMessage&)> send;
  // Where the engine's series go (borrowed), labelled job, rank and host. Null: nothing is recorded
  // (the hot path does no metrics work at all; used to measure what metrics cost).
  MetricsRegistry* metrics = nullptr;
};

class Engine {
 public:
  using Done = std::function<void(const v1::LocalCompletion&)>;

  explicit Engine(EngineOptions options);
  ~Engine();  // Stop()s

  void Start();

  // Queues one collective; `done` is called exactly once (from the engine thread, or from the
  // caller for an immediate rejection).
  void Enqueue(const v1::LocalEnqueue& enqueue, Done done);

  // A response list from the coordinator for this job.
  void OnResponses(v1::ResponseList list);

  // Fails every pending and future operation with `status` (job stopped, peer lost).
  void Abort(const absl::Status& status);

  // Aborts (with CANCELLED) what is pending and joins the engine thread.
  void Stop();

 private:
  struct Op {
    v1::LocalEnqueue enqueue;
    Done done;
  };

  // A response list and when it arrived.
  struct Arrived {
    v1::ResponseList list;
    absl::Time time;
  };

  // Activities of the response being executed, for the timeline (engine thread only).
  class Activities {
   public:
    Activities(bool on, absl::Time arrived) : on_(on), arrived_(arrived) {}
    absl::Time arrived() const { return arrived_; }
    // The activity that ends now.
    void End(const char* name) {
      if (on_) ends_.emplace_back(name, absl::ToUnixMicros(absl::Now()));
    }
    std::vector<std::pair<const char*, int64_t>>& ends() { return ends_; }

   private:
    const bool on_;
    const absl::Time arrived_;  // when the response list reached the worker
    std::vector<std::pair<const char*, int64_t>> ends_;
  };

  void Loop();
  void SendBatch(const std::vector<v1::TensorRequest>& requests);
  void Process(v1::ResponseList& list, absl::Time arrived);
  void Execute(const v1::Response& response, const std::vector<std::string>& names,
               Activities& activities);
  absl::Status ExecuteAllreduce(const v1::Response& r, const std::vector<Op*>& ops,
                                Activities& activities);
  // Reports the executed response's activities for the timeline (when the job has one).
  void SendSpan(const v1::Response& r, const std::vector<std::string>& names,
                Activities& activities);
  absl::Status ExecuteAllgather(const v1::Response& r, const std::vector<Op*>& ops,
                                std::vector<v1::LocalCompletion>* out);
  // What each tensor of an allgather response moves: this rank's shape (empty when joined), every
  // rank's bytes, and the result's rows and bytes. INVALID_ARGUMENT for a malformed response.
  struct AllgatherPart {
    std::vector<int64_t> shape;
    std::vector<int64_t> bytes;
    int64_t rows = 0;
    int64_t total = 0;
  };
  absl::StatusOr<std::vector<AllgatherPart>> PlanAllgather(const v1::Response& r,
                                                           const std::vector<Op*>& ops) const;
  static void SetAllgatherOutput(const AllgatherPart& part, size_t offset,
                                 v1::LocalCompletion* completion);
  absl::Status ExecuteOnDevice(const v1::Response& r, const std::vector<Op*>& ops,
                               std::vector<v1::LocalCompletion>* completions,
                               Activities& activities);
  // Removes the named ops from the table (nullptr for names this rank does not have, e.g. joined).
  std::vector<Op*> Take(const std::vector<std::string>& names) ABSL_LOCKS_EXCLUDED(mu_);
  void Complete(Op* op, const absl::Status& status, v1::LocalCompletion completion = {});
  std::string RankName() const;

  // The engine's metric series, registered once (null registry: a private one).
  struct Series {
    Counter* bytes[3];      // allreduce, broadcast, allgather
    Histogram* latency[4];  // allreduce, broadcast, allgather, barrier
    Histogram* fused_tensors;
    Histogram* fill_ratio;
    Gauge* bus_bandwidth;
    Gauge* queue_depth;
  };
  void CountError(absl::string_view kind);
  // Observes a successfully executed response. Engine thread only.
  void Record(const v1::Response& r, const std::vector<Op*>& ops, absl::Duration took);

  const EngineOptions options_;
  MetricsRegistry own_metrics_;
  MetricsRegistry* const metrics_;
  const bool record_;
  Labels labels_;
  Series series_;
  std::vector<std::unique_ptr<Backend>> backends_;  // engine thread only
  Backend* backend_ = nullptr;                      // backends_[0]
  absl::Status backend_status_;                     // engine thread only
  bool device_ready_ = false;                       // engine thread only: options_.device set up
  std::vector<uint8_t> fusion_buffer_;              // engine thread only
  int64_t fusion_threshold_ = 0;  // engine thread only: as the last response list said
  WorkerCache cache_;             // engine thread only

  bool Stopping() ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Op>> ops_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::TensorRequest> unsent_ ABSL_GUARDED_BY(mu_);  // copies: ops may be aborted
  absl::Time last_sent_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::deque<Arrived> responses_ ABSL_GUARDED_BY(mu_);
  absl::Duration cycle_time_ ABSL_GUARDED_BY(mu_);
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool joined_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ringmaster
