// One GPU rank's device side of a job (DeviceExecutor): the device arena shared with the training
// process once through a CUDA IPC memory handle, the interprocess events that order the two
// processes' streams, the device fusion buffer, and the NCCL communicator. The daemon creates it
// when the job starts (arena and events); the engine thread sets up the communicator and executes.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/gpu/device_executor.h"
#include "worker/gpu/nccl_backend.h"

namespace ringmaster {

struct GpuJobOptions {
  int device = 0;
  int rank = 0;
  int size = 1;
  int64_t arena_bytes = 0;
  // Interprocess events the daemon records when collectives are done (reused round robin: a stream
  // wait captures an event's record at the time it is enqueued).
  int done_events = 1024;
  // Creates the communicator; called on the engine thread by Setup() with the flag that Abort()
  // sets (for NcclBackendOptions::cancelled: a stop gives up a setup in progress).
  std::function<absl::StatusOr<std::unique_ptr<NcclBackend>>(
      std::shared_ptr<std::atomic<bool>> cancelled)>
      make_backend;
  // Creates a process set's communicator: `key` names the set (distinct per set and membership;
  // the rendezvous keys are under it), `set_rank` is this rank's place among `set_size` members,
  // `stream` the job's stream, which every communicator of the job shares (so one order holds on
  // the device: the packs, the collectives and the unpacks of consecutive responses never
  // overlap, whichever communicator each runs on).
  std::function<absl::StatusOr<std::unique_ptr<NcclBackend>>(
      std::shared_ptr<std::atomic<bool>> cancelled, const std::string& key, int set_rank,
      int set_size, void* stream)>
      make_set_backend;
};

class GpuJob final : public DeviceExecutor {
 public:
  // Allocates the arena and the events on `options.device`. FAILED_PRECONDITION (with CUDA's
  // reason) when the device or the memory is not available.
  static absl::StatusOr<std::unique_ptr<GpuJob>> Create(GpuJobOptions options);
  ~GpuJob() override;

  uint8_t* arena() const { return arena_; }  // device memory
  // cudaIpcMemHandle_t of the arena, and cudaIpcEventHandle_t of each done event, as bytes.
  const std::string& arena_handle() const { return arena_handle_; }
  const std::vector<std::string>& done_event_handles() const { return done_handles_; }
  // The GPU's PCI bus id ("0000:3B:00.0"): the training process finds the same GPU by it, whatever
  // its CUDA_VISIBLE_DEVICES.
  const std::string& pci_bus_id() const { return pci_bus_id_; }

  absl::Status Setup() override;
  absl::Status OpenReadyEvents(const std::vector<std::string>& handles) override;
  absl::Status UseProcessSet(int32_t id, const std::vector<int32_t>& ranks) override;
  void ReleaseProcessSet(int32_t id) override;
  absl::StatusOr<int32_t> Allreduce(const std::vector<Tensor>& tensors, DataType dtype, ReduceOp op,
                                    double prescale, double postscale) override;
  absl::StatusOr<int32_t> Broadcast(const Tensor& tensor, int64_t bytes, int root) override;
  absl::StatusOr<int32_t> Allgather(const Tensor& in, int64_t out_offset,
                                    const std::vector<int64_t>& bytes) override;
  absl::Status Barrier() override;
  void Abort(const std::string& why) override;

 private:
  explicit GpuJob(GpuJobOptions options) : options_(std::move(options)) {}
  absl::Status Init();
  // Makes the device stream wait for the tensors' ready events.
  absl::Status WaitReady(const std::vector<Tensor>& tensors);
  // At least `bytes` of device scratch (the fusion buffer).
  absl::StatusOr<uint8_t*> Scratch(int64_t bytes);
  // Records the next done event on the stream; returns its 1-based index.
  absl::StatusOr<int32_t> RecordDone();

  const GpuJobOptions options_;
  uint8_t* arena_ = nullptr;
  std::string arena_handle_;
  std::string pci_bus_id_;
  const std::shared_ptr<std::atomic<bool>> cancelled_ = std::make_shared<std::atomic<bool>>(false);
  std::vector<void*> done_events_;  // cudaEvent_t
  std::vector<std::string> done_handles_;
  int next_done_ = 0;  // engine thread only

  // The most process sets whose communicators a rank keeps (as CpuExecutor::kMaxProcessSets).
  static constexpr size_t kMaxProcessSets = 256;

  std::unique_ptr<NcclBackend> backend_;             // engine thread only, after Setup()
  std::atomic<NcclBackend*> live_backend_{nullptr};  // for Abort() from other threads
  // Process sets' communicators by key (engine thread only; destroyed before backend_, whose
  // stream they share), and the one the next calls use (backend_'s, or a set's) with its size.
  std::map<std::string, std::unique_ptr<NcclBackend>> sets_;
  // Sets released (their collectives are refused; at most kMaxReleased remembered).
  static constexpr size_t kMaxReleased = size_t{1} << 20;
  absl::flat_hash_set<int32_t> released_;
  NcclBackend* current_ = nullptr;
  int current_size_ = 0;
  void* stream_ = nullptr;  // cudaStream_t, the backend's
  uint8_t* scratch_ = nullptr;
  int64_t scratch_bytes_ = 0;

  absl::Mutex mu_;
  std::vector<void*> ready_events_ ABSL_GUARDED_BY(mu_);      // opened from the training process
  std::vector<void*> retired_events_ ABSL_GUARDED_BY(mu_);    // of an earlier connection
  std::vector<NcclBackend*> live_sets_ ABSL_GUARDED_BY(mu_);  // for Abort()
  std::string aborted_ ABSL_GUARDED_BY(mu_);                  // why, if Abort() came before Setup()
};

}  // namespace ringmaster
