#include "worker/gpu/nccl_backend.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>
#include <filesystem>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "worker/gpu/nccl_mapping.h"
#include "worker/gpu/watchdog.h"

namespace ringmaster {
namespace {

absl::Status CudaStatus(cudaError_t e, absl::string_view what, absl::string_view where) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("CUDA ", what, " on ", where, " failed: ", cudaGetErrorString(e)));
}

// Waits by yielding for the first millisecond (a collective's completion is seen within
// microseconds: the next response's work is enqueued without a gap), then with short sleeps (long
// collectives do not burn a core). `spins` counts calls: 0 starts a wait.
void Pause(int* spins) {
  thread_local std::chrono::steady_clock::time_point started;
  if ((*spins)++ == 0) started = std::chrono::steady_clock::now();
  if (std::chrono::steady_clock::now() - started < std::chrono::milliseconds(1)) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

class NcclCommunicator final : public NcclBackend, public WatchedCommunicator {
 public:
  NcclCommunicator(NcclBackendOptions options) : options_(std::move(options)) {}

  ~NcclCommunicator() override {
    if (comm_ != nullptr) {
      if (watchdog_ == nullptr) {
        ncclCommAbort(comm_);
      } else if (!Finalize()) {
        // Failed, or a peer is gone: abort (never a blocking destroy).
        watchdog_->PeerLost("the communicator is being released");
      }
    }
    if (event_ != nullptr) cudaEventDestroy(event_);
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (stream_ != nullptr && options_.stream == nullptr) cudaStreamDestroy(stream_);
  }

  absl::Status Init() {
    const std::string& where = options_.where;
    if (absl::Status s = CheckCudaDevice(options_.device); !s.ok()) return s;
    if (absl::Status s = CudaStatus(cudaSetDevice(options_.device), "cudaSetDevice", where);
        !s.ok()) {
      return s;
    }
    if (options_.stream != nullptr) {
      stream_ = static_cast<cudaStream_t>(options_.stream);
    } else if (absl::Status s =
                   CudaStatus(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                              "stream creation", where);
               !s.ok()) {
      return s;
    }
    if (absl::Status s = CudaStatus(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming),
                                    "event creation", where);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = CudaStatus(cudaMalloc(&scratch_, 16), "scratch allocation", where);
        !s.ok()) {
      return s;
    }
    // The unique id: rank 0 makes it, everyone reads it from the epoch's store.
    ncclUniqueId id;
    const std::string key = absl::StrCat(options_.prefix, "unique_id");
    if (options_.rank == 0) {
      if (absl::Status s = NcclStatus(ncclGetUniqueId(&id), "unique id", where); !s.ok()) return s;
      if (absl::Status s =
              options_.store->Set(key, std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
          !s.ok()) {
        return s;
      }
    } else {
      absl::StatusOr<std::vector<std::string>> values =
          options_.store->Wait({key}, options_.timeout);
      if (!values.ok()) {
        return absl::Status(values.status().code(), absl::StrCat("NCCL rendezvous of ", where, ": ",
                                                                 values.status().message()));
      }
      if ((*values)[0].size() != sizeof(id)) {
        return absl::InternalError(absl::StrCat("NCCL unique id from the store has ",
                                                (*values)[0].size(), " bytes, not ", sizeof(id)));
      }
      std::memcpy(&id, (*values)[0].data(), sizeof(id));
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&comm_, options_.size, id, options_.rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      return NcclStatus(r, "communicator setup", where, LastError());
    }
    watchdog_ = std::make_unique<Watchdog>(this, where, options_.timeout, options_.on_fail);
    const absl::Time deadline = options_.clock->Now() + options_.timeout;
    int spins = 0;
    while (true) {
      ncclResult_t state = ncclInProgress;
      ncclCommGetAsyncError(comm_, &state);
      if (state == ncclSuccess) return absl::OkStatus();
      if (state != ncclInProgress) {
        absl::Status s = NcclStatus(state, "communicator setup", where, LastError());
        watchdog_->PeerLost(std::string(s.message()));
        return s;
      }
      if (options_.cancelled != nullptr && options_.cancelled->load()) {
        absl::Status s = absl::CancelledError(
            absl::StrCat("NCCL communicator setup on ", where, " cancelled: the job stopped"));
        watchdog_->PeerLost(std::string(s.message()));
        return s;
      }
      if (options_.clock->Now() > deadline) {
        absl::Status s = absl::DeadlineExceededError(
            absl::StrCat("NCCL communicator setup on ", where, " did not complete in ",
                         absl::FormatDuration(options_.timeout), " (are all ", options_.size,
                         " ranks up, and can they reach each other? see NCCL_SOCKET_IFNAME)"));
        watchdog_->PeerLost(std::string(s.message()));
        return s;
      }
      Pause(&spins);
    }
  }

  // A healthy communicator is finalized (its last operations' traffic drained, so peers finish
  // theirs) and destroyed, within the timeout; returns false when it must be aborted instead. Each
  // call holds the watchdog's lock only for itself, so an abort from another thread is not held up
  // by the polling.
  bool Finalize() {
    ncclResult_t r = ncclInternalError;
    if (!watchdog_->WithCommunicator([&] { r = ncclCommFinalize(comm_); })) return false;
    const absl::Time deadline = options_.clock->Now() + options_.timeout;
    int spins = 0;
    while (r == ncclInProgress) {
      if (options_.clock->Now() > deadline) return false;
      Pause(&spins);
      if (!watchdog_->WithCommunicator([&] { ncclCommGetAsyncError(comm_, &r); })) return false;
    }
    if (r != ncclSuccess) return false;
    // Whatever ncclCommDestroy returns, the communicator is gone afterwards: never abort it then.
    const bool destroyed = watchdog_->WithCommunicator([&] {
      ncclCommDestroy(comm_);
      comm_ = nullptr;
    });
    return destroyed;
  }

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  void* stream() const override { return stream_; }

  absl::Status Allreduce(void* data, int64_t count, DataType dtype, ReduceOp op) override {
    absl::StatusOr<ncclDataType_t> type = ToNcclDataType(dtype);
    if (!type.ok()) return type.status();
    absl::StatusOr<NcclReduction> reduction = ToNcclReduction(op, options_.size);
    if (!reduction.ok()) return reduction.status();
    return Run("allreduce", [&] {
      return ncclAllReduce(data, data, static_cast<size_t>(count), *type, reduction->op, comm_,
                           stream_);
    });
  }

  absl::Status Broadcast(void* data, int64_t bytes, int root) override {
    return Run("broadcast", [&] {
      return ncclBroadcast(data, data, static_cast<size_t>(bytes), ncclUint8, root, comm_, stream_);
    });
  }

  absl::Status Allgatherv(const void* in, void* out, absl::Span<const int64_t> bytes) override {
    if (static_cast<int>(bytes.size()) != options_.size) {
      return absl::InvalidArgumentError(
          absl::StrCat("allgatherv: ", bytes.size(), " parts for ", options_.size, " ranks"));
    }
    // Parts of different sizes: one broadcast per rank, grouped into one NCCL launch.
    return Run("allgather", [&] {
      ncclGroupStart();
      int64_t at = 0;
      for (int r = 0; r < options_.size; ++r) {
        uint8_t* dst = static_cast<uint8_t*>(out) + at;
        const void* src = r == options_.rank ? in : dst;
        ncclBroadcast(src, dst, static_cast<size_t>(bytes[r]), ncclUint8, r, comm_, stream_);
        at += bytes[r];
      }
      return ncclGroupEnd();
    });
  }

  absl::Status Barrier() override {
    return Run("barrier", [&] {
      return ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, stream_);
    });
  }

  void Abort(const std::string& why) override {
    if (watchdog_ != nullptr) watchdog_->PeerLost(why);
  }

  // WatchedCommunicator.
  absl::Status AsyncError() override {
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) return NcclStatus(r, "error query", options_.where, LastError());
    if (state == ncclSuccess || state == ncclInProgress) return absl::OkStatus();
    return NcclFailure(state, LastError());  // the watchdog names the rank
  }
  void Abort() override { ncclCommAbort(comm_); }

 private:
  std::string LastError() const { return comm_ != nullptr ? ncclGetLastError(comm_) : ""; }

  // Enqueues with `enqueue` (polling a non-blocking communicator until the call is enqueued), then
  // waits for the stream's event under the watchdog.
  template <typename F>
  absl::Status Run(const char* what, F enqueue) {
    if (absl::Status s = watchdog_->OpStarted(what, options_.clock->Now()); !s.ok()) return s;
    absl::Status status = RunLocked(what, enqueue);
    watchdog_->OpFinished();
    return status;
  }

  template <typename F>
  absl::Status RunLocked(const char* what, F enqueue) {
    // Every call on the communicator goes through the watchdog, which may abort (and free) it from
    // another thread.
    ncclResult_t r = ncclSuccess;
    std::string detail;
    if (!watchdog_->WithCommunicator([&] {
          r = enqueue();
          if (r != ncclSuccess && r != ncclInProgress) detail = LastError();
        })) {
      return watchdog_->failure();
    }
    int spins = 0;
    while (r == ncclInProgress) {
      if (auto failed = watchdog_->Check(options_.clock->Now())) return *failed;
      if (!watchdog_->WithCommunicator([&] {
            ncclCommGetAsyncError(comm_, &r);
            if (r != ncclSuccess && r != ncclInProgress) detail = LastError();
          })) {
        return watchdog_->failure();
      }
      Pause(&spins);
    }
    if (r != ncclSuccess) {
      // An asynchronous error: the watchdog aborts and reports it (as if its own poll found it).
      if (auto failed = watchdog_->Check(options_.clock->Now())) return *failed;
      if (watchdog_->state() == Watchdog::State::kAborted) return watchdog_->failure();
      return NcclStatus(r, what, options_.where, detail);
    }
    if (absl::Status s =
            CudaStatus(cudaEventRecord(event_, stream_), "event record", options_.where);
        !s.ok()) {
      return s;
    }
    spins = 0;
    while (true) {
      const cudaError_t e = cudaEventQuery(event_);
      if (e == cudaSuccess) {
        // An abort from another thread also lets the event complete: the data are then partial.
        if (watchdog_->state() == Watchdog::State::kAborted) return watchdog_->failure();
        if (auto failed = watchdog_->Check(options_.clock->Now())) return *failed;
        return absl::OkStatus();
      }
      if (e != cudaErrorNotReady) return CudaStatus(e, what, options_.where);
      if (auto failed = watchdog_->Check(options_.clock->Now())) return *failed;
      if (watchdog_->state() == Watchdog::State::kAborted) return watchdog_->failure();
      Pause(&spins);
    }
  }

  const NcclBackendOptions options_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t event_ = nullptr;
  void* scratch_ = nullptr;
  std::unique_ptr<Watchdog> watchdog_;
};

}  // namespace

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

CudaProbe ProbeCuda() {
  CudaProbe probe;
  const cudaError_t e = cudaGetDeviceCount(&probe.devices);
  if (e != cudaSuccess) {
    cudaGetLastError();
    probe.devices = 0;
  }
  std::error_code error;
  probe.driver_installed = std::filesystem::exists("/proc/driver/nvidia/version", error) ||
                           std::filesystem::exists("/dev/nvidiactl", error);
  if (probe.devices == 0) {
    int runtime = 0, driver = 0;
    cudaRuntimeGetVersion(&runtime);
    cudaDriverGetVersion(&driver);
    probe.problem = absl::StrCat(
        "no CUDA device: ", e == cudaSuccess ? "none visible" : cudaGetErrorString(e),
        " (CUDA runtime ", runtime / 1000, ".", runtime % 1000 / 10, ", driver supports ",
        driver / 1000, ".", driver % 1000 / 10,
        probe.driver_installed ? "; an NVIDIA driver is installed)" : "; no NVIDIA driver)");
  }
  return probe;
}

absl::Status CheckCudaDevice(int device) {
  int n = 0;
  const cudaError_t count = cudaGetDeviceCount(&n);
  if (count == cudaErrorInsufficientDriver || count == cudaErrorNoDevice) {
    // What CUDA says on a machine without the NVIDIA driver ("CUDA driver version is
    // insufficient") reads as if an upgrade would help.
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda:", device, " cannot be used: no NVIDIA GPU is usable here (",
        cudaGetErrorString(count),
        "; is the NVIDIA driver installed and the GPU visible, e.g. nvidia-smi lists it?); on a "
        "machine without GPUs run the worker with --device cpu"));
  }
  if (count != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuda:", device, " cannot be used: ", cudaGetErrorString(count)));
  }
  if (device < 0 || device >= n) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda:", device, " does not exist: this process sees ", n, " CUDA device",
        n == 1 ? "" : "s", " (check CUDA_VISIBLE_DEVICES and the container's GPU access)"));
  }
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuda:", device, " cannot be used: ", cudaGetErrorString(e)));
  }
  // The daemon and the training process both need a context on the GPU.
  int mode = cudaComputeModeDefault;
  if (cudaDeviceGetAttribute(&mode, cudaDevAttrComputeMode, device) == cudaSuccess &&
      mode != cudaComputeModeDefault) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda:", device, " is in ",
        mode == cudaComputeModeProhibited ? "prohibited" : "exclusive-process",
        " compute mode: the worker daemon and the training process must both use it (set the "
        "Default compute mode with nvidia-smi -c DEFAULT, or run MPS)"));
  }
  // Creating the context is what fails for a device that is busy in exclusive-process mode.
  if (cudaError_t e = cudaFree(nullptr); e != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda:", device, " cannot be used: ", cudaGetErrorString(e),
        e == cudaErrorDevicesUnavailable ? " (busy: another process holds it in exclusive mode)"
                                         : ""));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<NcclBackend>> CreateNcclBackend(NcclBackendOptions options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL backend: rank ", options.rank, " of ", options.size));
  }
  if (options.store == nullptr) return absl::InvalidArgumentError("NCCL backend: no store");
  if (options.where.empty()) {
    options.where = absl::StrCat("rank ", options.rank, " (cuda:", options.device, ")");
  }
  auto backend = std::make_unique<NcclCommunicator>(std::move(options));
  if (absl::Status s = backend->Init(); !s.ok()) return s;
  return backend;
}

}  // namespace ringmaster
