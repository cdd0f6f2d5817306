#include "worker/gpu/gpu_job.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"
#include "worker/gpu/fusion_kernels.h"
#include "worker/gpu/fusion_layout.h"
#include "worker/gpu/nccl_mapping.h"

namespace ringmaster {
namespace {

absl::Status Cuda(cudaError_t e, absl::string_view what) {
  if (e == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // clear it
  return absl::InternalError(absl::StrCat("CUDA ", what, ": ", cudaGetErrorString(e)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<GpuJob>> GpuJob::Create(GpuJobOptions options) {
  std::unique_ptr<GpuJob> job(new GpuJob(std::move(options)));
  if (absl::Status s = job->Init(); !s.ok()) return s;
  return job;
}

absl::Status GpuJob::Init() {
  if (absl::Status s = CheckCudaDevice(options_.device); !s.ok()) return s;
  void* arena = nullptr;
  if (cudaError_t e = cudaMalloc(&arena, static_cast<size_t>(options_.arena_bytes));
      e != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("cannot allocate the ", options_.arena_bytes,
                     "-byte device arena on cuda:", options_.device, ": ", cudaGetErrorString(e)));
  }
  arena_ = static_cast<uint8_t*>(arena);
  cudaIpcMemHandle_t handle;
  if (absl::Status s = Cuda(cudaIpcGetMemHandle(&handle, arena_), "arena IPC handle"); !s.ok()) {
    return s;
  }
  arena_handle_.assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
  char bus_id[32] = {};
  if (cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), options_.device) == cudaSuccess) {
    pci_bus_id_ = bus_id;
  }
  for (int i = 0; i < options_.done_events; ++i) {
    cudaEvent_t event;
    if (absl::Status s =
            Cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming | cudaEventInterprocess),
                 "event creation");
        !s.ok()) {
      return s;
    }
    done_events_.push_back(event);
    cudaIpcEventHandle_t h;
    if (absl::Status s = Cuda(cudaIpcGetEventHandle(&h, event), "event IPC handle"); !s.ok()) {
      return s;
    }
    done_handles_.emplace_back(reinterpret_cast<const char*>(&h), sizeof(h));
  }
  return absl::OkStatus();
}

GpuJob::~GpuJob() {
  cudaSetDevice(options_.device);  // this may be any thread
  cancelled_->store(true);
  // cudaFree synchronizes the device: if work is stuck on the stream (a collective whose peer is
  // gone, or a wait for a ready event of a training process that died), releasing memory would hang
  // this daemon. The stream (the backend's) gets a bounded time to drain; then the communicator is
  // aborted (which ends stuck NCCL kernels) and it gets another; past that, everything (the backend
  // included) is left to the process's exit.
  auto drained = [this](absl::Duration within) {
    const absl::Time deadline = absl::Now() + within;
    while (cudaStreamQuery(static_cast<cudaStream_t>(stream_)) == cudaErrorNotReady &&
           absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    return cudaStreamQuery(static_cast<cudaStream_t>(stream_)) != cudaErrorNotReady;
  };
  if (stream_ != nullptr && !drained(absl::Seconds(10))) {
    if (backend_ != nullptr) backend_->Abort("the job ended with work stuck on the device");
    for (auto& [key, set] : sets_) set->Abort("the job ended with work stuck on the device");
    if (!drained(absl::Seconds(5))) {
      spdlog::error(
          "cuda:{}: work is still queued after the job ended; the communicator was "
          "aborted and the job's device memory stays allocated until the worker exits",
          options_.device);
      live_backend_.store(nullptr);
      {
        absl::MutexLock lock(&mu_);
        live_sets_.clear();
      }
      for (auto& [key, set] : sets_) set.release();  // NOLINT: leaked as backend_ is
      backend_.release();  // NOLINT: deliberately leaked (its release would block)
      return;
    }
  }
  {
    absl::MutexLock lock(&mu_);
    live_sets_.clear();
  }
  sets_.clear();  // before backend_: they enqueue on its stream
  if (backend_ != nullptr) {
    live_backend_.store(nullptr);
    backend_.reset();  // finalizes its communicator, or aborts it (never a blocking destroy)
  }
  {
    absl::MutexLock lock(&mu_);
    for (void* e : ready_events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
    for (void* e : retired_events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  }
  for (void* e : done_events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  if (scratch_ != nullptr) cudaFree(scratch_);
  if (arena_ != nullptr) cudaFree(arena_);
}

absl::Status GpuJob::Setup() {
  if (absl::Status s = Cuda(cudaSetDevice(options_.device), "cudaSetDevice"); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<NcclBackend>> backend = options_.make_backend(cancelled_);
  if (!backend.ok()) return backend.status();
  backend_ = *std::move(backend);
  stream_ = backend_->stream();
  live_backend_.store(backend_.get());
  current_ = backend_.get();
  current_size_ = options_.size;
  std::string aborted;
  {
    absl::MutexLock lock(&mu_);
    aborted = aborted_;
  }
  if (!aborted.empty()) backend_->Abort(aborted);
  return absl::OkStatus();
}

void GpuJob::Abort(const std::string& why) {
  cancelled_->store(true);  // a setup in progress gives up
  {
    absl::MutexLock lock(&mu_);
    if (aborted_.empty()) aborted_ = why;
  }
  if (NcclBackend* b = live_backend_.load()) b->Abort(why);
  absl::MutexLock lock(&mu_);
  for (NcclBackend* set : live_sets_) set->Abort(why);
}

void GpuJob::ReleaseProcessSet(int32_t id) {
  const std::string prefix = absl::StrCat("ps", id, "-");
  for (auto it = sets_.lower_bound(prefix);
       it != sets_.end() && it->first.compare(0, prefix.size(), prefix) == 0;) {
    {
      absl::MutexLock lock(&mu_);
      live_sets_.erase(std::remove(live_sets_.begin(), live_sets_.end(), it->second.get()),
                       live_sets_.end());
    }
    if (current_ == it->second.get()) {
      current_ = backend_.get();
      current_size_ = options_.size;
    }
    it = sets_.erase(it);  // finalizes its communicator, or aborts it (never a blocking destroy)
  }
  if (released_.size() < kMaxReleased) released_.insert(id);
}

absl::Status GpuJob::UseProcessSet(int32_t id, const std::vector<int32_t>& ranks) {
  if (backend_ == nullptr) return absl::FailedPreconditionError("no communicator");
  if (ranks.empty()) {
    current_ = backend_.get();
    current_size_ = options_.size;
    return absl::OkStatus();
  }
  const auto me = std::lower_bound(ranks.begin(), ranks.end(), options_.rank);
  if (me == ranks.end() || *me != options_.rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options_.rank, " is not in process set ", id));
  }
  if (released_.contains(id)) {
    return absl::InvalidArgumentError(absl::StrCat("process set ", id, " was removed"));
  }
  const std::string key = absl::StrCat("ps", id, "-", absl::StrJoin(ranks, "_"));
  auto it = sets_.find(key);
  if (it == sets_.end()) {
    if (!options_.make_set_backend) {
      return absl::UnimplementedError("process sets are not available on this worker");
    }
    if (sets_.size() >= kMaxProcessSets) {
      return absl::ResourceExhaustedError(
          absl::StrCat("a rank keeps the communicators of at most ", kMaxProcessSets,
                       " process sets: remove the ones no longer used (hvd.remove_process_set)"));
    }
    absl::StatusOr<std::unique_ptr<NcclBackend>> made =
        options_.make_set_backend(cancelled_, key, static_cast<int>(me - ranks.begin()),
                                  static_cast<int>(ranks.size()), stream_);
    if (!made.ok()) {  // fatal whatever its code: the set's other members may be in NCCL's setup
      return absl::UnavailableError(
          absl::StrCat("process set ", id, ": ", made.status().message()));
    }
    std::string aborted;
    {
      absl::MutexLock lock(&mu_);
      live_sets_.push_back(made->get());
      aborted = aborted_;
    }
    if (!aborted.empty()) (*made)->Abort(aborted);
    it = sets_.emplace(key, *std::move(made)).first;
  }
  current_ = it->second.get();
  current_size_ = static_cast<int>(ranks.size());
  return absl::OkStatus();
}

absl::Status GpuJob::OpenReadyEvents(const std::vector<std::string>& handles) {
  if (handles.size() > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(handles.size(), " ready events; at most 4096"));
  }
  // Called on a connection's thread: the CUDA device is per thread.
  if (absl::Status s = Cuda(cudaSetDevice(options_.device), "cudaSetDevice"); !s.ok()) return s;
  std::vector<void*> opened;
  for (const std::string& bytes : handles) {
    cudaIpcEventHandle_t h;
    if (bytes.size() != sizeof(h)) {
      return absl::InvalidArgumentError(
          absl::StrCat("a ready event handle has ", bytes.size(), " bytes, not ", sizeof(h)));
    }
    std::memcpy(&h, bytes.data(), sizeof(h));
    cudaEvent_t event;
    if (absl::Status s = Cuda(cudaIpcOpenEventHandle(&event, h), "opening a ready event");
        !s.ok()) {
      for (void* e : opened) cudaEventDestroy(static_cast<cudaEvent_t>(e));
      return s;
    }
    opened.push_back(event);
  }
  absl::MutexLock lock(&mu_);
  // The engine may still hold an event of the previous connection: retire, destroy at the end.
  for (void* e : ready_events_) retired_events_.push_back(e);
  ready_events_ = std::move(opened);
  return absl::OkStatus();
}

absl::Status GpuJob::WaitReady(const std::vector<Tensor>& tensors) {
  std::vector<void*> waits;
  {
    absl::MutexLock lock(&mu_);
    for (const Tensor& t : tensors) {
      if (t.ready_event <= 0) continue;
      if (t.ready_event > static_cast<int32_t>(ready_events_.size())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "ready event ", t.ready_event, " was not shared (", ready_events_.size(), " were)"));
      }
      waits.push_back(ready_events_[t.ready_event - 1]);
    }
  }
  for (void* e : waits) {
    if (absl::Status s = Cuda(
            cudaStreamWaitEvent(static_cast<cudaStream_t>(stream_), static_cast<cudaEvent_t>(e), 0),
            "waiting for a tensor's ready event");
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<uint8_t*> GpuJob::Scratch(int64_t bytes) {
  if (bytes <= scratch_bytes_) return scratch_;
  if (scratch_ != nullptr) {
    // Work queued on the stream may still use it. That is earlier responses' work only (whose
    // collectives have completed: callers queue this response's ready-event waits after this), so
    // the wait is short and cannot hang on a training process.
    cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
    cudaFree(scratch_);
    scratch_ = nullptr;
    scratch_bytes_ = 0;
  }
  void* p = nullptr;
  if (absl::Status s = Cuda(cudaMalloc(&p, static_cast<size_t>(bytes)), "fusion buffer"); !s.ok()) {
    return s;
  }
  scratch_ = static_cast<uint8_t*>(p);
  scratch_bytes_ = bytes;
  return scratch_;
}

absl::StatusOr<int32_t> GpuJob::RecordDone() {
  const int i = next_done_;
  next_done_ = (next_done_ + 1) % static_cast<int>(done_events_.size());
  if (absl::Status s = Cuda(cudaEventRecord(static_cast<cudaEvent_t>(done_events_[i]),
                                            static_cast<cudaStream_t>(stream_)),
                            "recording the done event");
      !s.ok()) {
    return s;
  }
  return i + 1;
}

absl::StatusOr<int32_t> GpuJob::Allreduce(const std::vector<Tensor>& tensors, DataType dtype,
                                          ReduceOp op, double prescale, double postscale) {
  // The stream waits for the tensors' ready events only once the fusion buffer is there: growing
  // it synchronizes the stream, which must not wait for the training process then.
  absl::StatusOr<NcclReduction> reduction = ToNcclReduction(op, current_size_);
  if (!reduction.ok()) return reduction.status();
  const int64_t elem = DataTypeSize(dtype);
  auto stream = static_cast<cudaStream_t>(stream_);
  std::vector<int64_t> bytes;
  for (const Tensor& t : tensors) bytes.push_back(t.count * elem);
  absl::StatusOr<FusionLayout> layout = PlanFusion(bytes, elem);
  if (!layout.ok()) return layout.status();
  // Reduced where they are only when the tensors lie in the arena exactly as the fusion buffer
  // would hold them (no padding): every rank then reduces the same elements in the same places,
  // whichever way each one goes (another rank's tensors may not be adjacent, or it may have
  // joined).
  bool contiguous = !tensors.empty() && layout->padding_bytes == 0;
  int64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    total += tensors[i].count;
    if (tensors[i].offset < 0 || tensors[i].offset - tensors[0].offset != layout->offsets[i]) {
      contiguous = false;
    }
  }
  const bool post = postscale != 1.0 || reduction->divide_by > 1;
  if (contiguous) {
    // Already one buffer: scale in place (if at all) and reduce there.
    if (absl::Status s = WaitReady(tensors); !s.ok()) return s;
    uint8_t* data = arena_ + tensors[0].offset;
    if (prescale != 1.0) {
      if (absl::Status s = ScaledCopy({{data, data, total}}, dtype, prescale, 1, stream); !s.ok()) {
        return s;
      }
    }
    if (absl::Status s = current_->Allreduce(data, total, dtype, op); !s.ok()) return s;
    if (post) {
      if (absl::Status s =
              ScaledCopy({{data, data, total}}, dtype, postscale, reduction->divide_by, stream);
          !s.ok()) {
        return s;
      }
    }
    return RecordDone();
  }
  absl::StatusOr<uint8_t*> fusion = Scratch(layout->total_bytes);
  if (!fusion.ok()) return fusion.status();
  if (absl::Status s = WaitReady(tensors); !s.ok()) return s;
  std::vector<DeviceSegment> pack, unpack;
  for (size_t i = 0; i < tensors.size(); ++i) {
    uint8_t* slot = *fusion + layout->offsets[i];
    // A joined rank (no tensor) contributes zeros.
    pack.push_back(
        {tensors[i].offset >= 0 ? arena_ + tensors[i].offset : nullptr, slot, tensors[i].count});
    if (tensors[i].offset >= 0) {
      unpack.push_back({slot, arena_ + tensors[i].offset, tensors[i].count});
    }
  }
  if (absl::Status s = ScaledCopy(pack, dtype, prescale, 1, stream); !s.ok()) return s;
  if (absl::Status s = current_->Allreduce(*fusion, layout->Elements(elem), dtype, op); !s.ok()) {
    return s;
  }
  if (absl::Status s = ScaledCopy(unpack, dtype, postscale, reduction->divide_by, stream);
      !s.ok()) {
    return s;
  }
  return RecordDone();
}

absl::StatusOr<int32_t> GpuJob::Broadcast(const Tensor& tensor, int64_t bytes, int root) {
  uint8_t* data;
  if (tensor.offset >= 0) {
    data = arena_ + tensor.offset;
  } else {  // joined: take part with scratch memory (before any wait is queued: see Allreduce)
    absl::StatusOr<uint8_t*> scratch = Scratch(bytes);
    if (!scratch.ok()) return scratch.status();
    data = *scratch;
  }
  if (absl::Status s = WaitReady({tensor}); !s.ok()) return s;
  if (absl::Status s = current_->Broadcast(data, bytes, root); !s.ok()) return s;
  return RecordDone();
}

absl::StatusOr<int32_t> GpuJob::Allgather(const Tensor& in, int64_t out_offset,
                                          const std::vector<int64_t>& bytes) {
  uint8_t* out = out_offset >= 0 ? arena_ + out_offset : nullptr;
  if (out == nullptr) {  // before any wait is queued: see Allreduce
    int64_t total = 0;
    for (int64_t b : bytes) total += b;
    absl::StatusOr<uint8_t*> scratch = Scratch(total);
    if (!scratch.ok()) return scratch.status();
    out = *scratch;
  }
  if (absl::Status s = WaitReady({in}); !s.ok()) return s;
  const uint8_t* src = in.offset >= 0 ? arena_ + in.offset : out;
  if (absl::Status s = current_->Allgatherv(src, out, bytes); !s.ok()) return s;
  return RecordDone();
}

absl::Status GpuJob::Barrier() { return current_->Barrier(); }

}  // namespace ringmaster
