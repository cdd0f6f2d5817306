// A GPU slot's staging: the daemon's device arena (opened once from its IPC handle), the events the
// daemon records when collectives are done (opened once), and the events this process records when
// tensors are ready (created here, shared once). Compiled only when CUDA is found; CUDA's runtime
// is loaded when a GPU slot is first served (the client links no CUDA library, so programs built
// with it run on machines without CUDA).
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstring>
#include <deque>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/staging.h"

namespace ringmaster {
namespace {

// The CUDA runtime calls this file makes, as function pointers that hide the runtime's own
// declarations (being objects, they also keep argument-dependent lookup from finding those): set
// once by LoadCudaRuntime(), before any staging exists.
// clang-format off
#define RINGMASTER_CUDART_CALLS(X) \
  X(cudaDeviceGetByPCIBusId) \
  X(cudaDeviceSynchronize) \
  X(cudaEventCreateWithFlags) \
  X(cudaEventDestroy) \
  X(cudaEventQuery) \
  X(cudaEventRecord) \
  X(cudaEventSynchronize) \
  X(cudaGetDevice) \
  X(cudaGetErrorString) \
  X(cudaGetLastError) \
  X(cudaIpcCloseMemHandle) \
  X(cudaIpcGetEventHandle) \
  X(cudaIpcOpenEventHandle) \
  X(cudaIpcOpenMemHandle) \
  X(cudaMemcpyAsync) \
  X(cudaPointerGetAttributes) \
  X(cudaSetDevice) \
  X(cudaStreamSynchronize) \
  X(cudaStreamWaitEvent)
// clang-format on
#define RINGMASTER_CUDART_POINTER(name) decltype(&::name) name = nullptr;
RINGMASTER_CUDART_CALLS(RINGMASTER_CUDART_POINTER)
#undef RINGMASTER_CUDART_POINTER

// libcudart.so.<major> of the CUDA this was built with, by the loader's search path, else under
// /usr/local/cuda/lib64. OK once every call is resolved.
absl::Status LoadCudaRuntimeOnce() {
  const std::string soname = absl::StrCat("libcudart.so.", CUDART_VERSION / 1000);
  void* library = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const std::string first = dlerror();
    library = dlopen(("/usr/local/cuda/lib64/" + soname).c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the worker serves a GPU, but CUDA's runtime cannot be loaded here (", first,
          "): install CUDA ", CUDART_VERSION / 1000, "'s runtime where the loader finds it"));
    }
  }
#define RINGMASTER_CUDART_RESOLVE(name)                                           \
  name = reinterpret_cast<decltype(name)>(dlsym(library, #name));                 \
  if (name == nullptr) {                                                          \
    return absl::FailedPreconditionError(absl::StrCat(soname, " has no " #name)); \
  }
  RINGMASTER_CUDART_CALLS(RINGMASTER_CUDART_RESOLVE)
#undef RINGMASTER_CUDART_RESOLVE
  return absl::OkStatus();
}

absl::Status LoadCudaRuntime() {
  static const absl::Status loaded = LoadCudaRuntimeOnce();
  return loaded;
}

constexpr int kReadyEvents = 1024;

absl::Status CudaError(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();
  return absl::UnavailableError(absl::StrCat("CUDA ", what, ": ", cudaGetErrorString(e)));
}

// The driver's cuCtxGetCurrent / cuCtxSetCurrent, from the libcuda the CUDA runtime has loaded
// (nullptr before it has): the client links no libcuda, so it loads on machines without a driver.
struct DriverContextCalls {
  using Get = int (*)(void**);
  using Set = int (*)(void*);
  Get get = nullptr;
  Set set = nullptr;
  DriverContextCalls() {
    if (void* cuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD)) {
      get = reinterpret_cast<Get>(dlsym(cuda, "cuCtxGetCurrent"));
      set = reinterpret_cast<Set>(dlsym(cuda, "cuCtxSetCurrent"));
    }
  }
};

// Makes `device` current on this thread (the user's thread may have another one current: the legacy
// default stream and new events are per device) and restores the thread's previous CUDA context
// (none, on a thread that never used CUDA: restoring by device number would create a context on
// GPU 0 there).
class DeviceGuard final : public Staging::DeviceScope {
 public:
  explicit DeviceGuard(int device) {
    static const DriverContextCalls driver;
    int current = -1;
    if (cudaGetDevice(&current) == cudaSuccess && current == device) return;
    if (driver.get == nullptr || driver.set == nullptr || driver.get(&previous_) != 0) {
      cudaSetDevice(device);  // no way back: leave the slot's device current
      return;
    }
    set_ = driver.set;
    cudaSetDevice(device);
  }
  ~DeviceGuard() override {
    if (set_ != nullptr) set_(previous_);
  }

 private:
  void* previous_ = nullptr;  // CUcontext
  DriverContextCalls::Set set_ = nullptr;
};

class CudaStaging final : public Staging {
 public:
  CudaStaging(int device, uint8_t* base, size_t bytes) : Staging(base, bytes), device_(device) {}

  // A process that outlives its job must not keep the arena mapped (nor leak events).
  ~CudaStaging() override {
    cudaSetDevice(device_);
    cudaDeviceSynchronize();  // nothing may still use the arena or the events
    for (cudaEvent_t e : done_) cudaEventDestroy(e);
    for (cudaEvent_t e : ready_) cudaEventDestroy(e);
    for (auto& [offset, e] : pending_frees_) cudaEventDestroy(e);
    for (cudaEvent_t e : spare_events_) cudaEventDestroy(e);
    cudaIpcCloseMemHandle(base());
  }

  // Opens the done events and creates and shares the ready events.
  absl::Status Open(const DeviceArena& arena) {
    for (const std::string& bytes : arena.done_events) {
      cudaIpcEventHandle_t h;
      if (bytes.size() != sizeof(h)) return absl::InternalError("bad done event handle");
      std::memcpy(&h, bytes.data(), sizeof(h));
      cudaEvent_t e;
      if (absl::Status s = CudaError(cudaIpcOpenEventHandle(&e, h), "opening a done event");
          !s.ok()) {
        return s;
      }
      done_.push_back(e);
    }
    for (int i = 0; i < kReadyEvents; ++i) {
      cudaEvent_t e;
      if (absl::Status s = CudaError(
              cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventInterprocess),
              "creating a ready event");
          !s.ok()) {
        return s;
      }
      ready_.push_back(e);
      cudaIpcEventHandle_t h;
      if (absl::Status s = CudaError(cudaIpcGetEventHandle(&h, e), "sharing a ready event");
          !s.ok()) {
        return s;
      }
      ready_handles_.emplace_back(reinterpret_cast<char*>(&h), sizeof(h));
    }
    absl::MutexLock lock(&ready_mu_);
    ready_busy_.assign(kReadyEvents, 0);
    return absl::OkStatus();
  }

  int device() const override { return device_; }

  std::unique_ptr<DeviceScope> EnterDevice() override {
    return std::make_unique<DeviceGuard>(device_);
  }

  void BindThread() override { cudaSetDevice(device_); }

  absl::Status Copy(void* dst, const void* src, size_t bytes, void* stream, const char* what,
                    bool wait) override {
    auto s_ = static_cast<cudaStream_t>(stream);
    absl::Status s = CudaError(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s_), what);
    if (s.ok() && wait) s = CudaError(cudaStreamSynchronize(s_), what);
    return s;
  }

  bool HostMemory(const void* p) const override {
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();
      return true;  // unknown to CUDA: plain host memory
    }
    return a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged;
  }

  absl::StatusOr<int> RecordReady(void* stream) override {
    int slot = -1;
    {
      absl::MutexLock lock(&ready_mu_);
      for (size_t tried = 0; tried < ready_.size() && slot < 0; ++tried) {
        const size_t i = next_ready_;
        next_ready_ = (i + 1) % ready_.size();
        if (ready_busy_[i]) continue;
        ready_busy_[i] = 1;
        slot = static_cast<int>(i);
      }
    }
    if (slot < 0) {  // every event in use: the tensor is ready once the stream has drained
      if (absl::Status s = CudaError(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)),
                                     "synchronizing the stream");
          !s.ok()) {
        return s;
      }
      return -1;
    }
    if (absl::Status s = CudaError(cudaEventRecord(ready_[slot], static_cast<cudaStream_t>(stream)),
                                   "recording a ready event");
        !s.ok()) {
      ReadyDone(slot);
      return s;
    }
    return slot;
  }

  void ReadyDone(int ready) override {
    if (ready < 0) return;
    absl::MutexLock lock(&ready_mu_);
    ready_busy_[ready] = 0;
  }

  std::vector<std::string> ReadyEventHandles() const override { return ready_handles_; }

  absl::Status WaitDone(int32_t done_event, void* stream) override {
    if (done_event <= 0) return absl::OkStatus();
    if (done_event > static_cast<int32_t>(done_.size())) {
      return absl::InternalError(absl::StrCat("done event ", done_event, " was not shared"));
    }
    return CudaError(
        cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), done_[done_event - 1], 0),
        "waiting for the worker's done event");
  }

  absl::Status JoinStreams(void* from, void* to) override {
    DeviceGuard guard(device_);
    cudaEvent_t event = TakeEvent();
    if (event == nullptr) return absl::UnavailableError("CUDA: cannot create an event");
    absl::Status s = CudaError(cudaEventRecord(event, static_cast<cudaStream_t>(from)),
                               "ordering the result on the waiting stream");
    if (s.ok()) {
      s = CudaError(cudaStreamWaitEvent(static_cast<cudaStream_t>(to), event, 0),
                    "ordering the result on the waiting stream");
    }
    ReturnEvent(event);  // the wait captured the record: reusable at once
    return s;
  }

  // Reusable once the work queued on `stream` so far (the copy out) is done: an event marks it, and
  // the next stagings reap it (the next tensor staged there may be copied in on another stream).
  void Release(size_t offset, void* stream) override {
    DeviceGuard guard(device_);  // the events are the slot device's
    const auto s = static_cast<cudaStream_t>(stream);
    if (cudaEvent_t event = TakeEvent()) {
      if (cudaEventRecord(event, s) == cudaSuccess) {
        absl::MutexLock lock(&free_mu_);
        pending_frees_.emplace_back(offset, event);
        return;
      }
      cudaGetLastError();
      ReturnEvent(event);
    }
    cudaStreamSynchronize(s);  // no event: wait here instead (no lock held)
    allocator().Free(offset).IgnoreError();
  }

  bool Reclaim(bool wait) override {
    std::deque<std::pair<size_t, cudaEvent_t>> waited;
    if (wait) {
      // Waited for with the lock released: completions (which release memory) go on meanwhile.
      {
        absl::MutexLock lock(&free_mu_);
        waited.swap(pending_frees_);
      }
      for (auto& [offset, event] : waited) {
        if (cudaEventSynchronize(event) != cudaSuccess) cudaGetLastError();
      }
    }
    absl::MutexLock lock(&free_mu_);
    bool freed = false;
    for (auto& [offset, event] : waited) {
      spare_events_.push_back(event);
      allocator().Free(offset).IgnoreError();
      freed = true;
    }
    while (!pending_frees_.empty()) {
      auto [offset, event] = pending_frees_.front();
      const cudaError_t e = cudaEventQuery(event);
      if (e == cudaErrorNotReady) break;  // completes in order per stream; others wait a turn
      if (e != cudaSuccess) cudaGetLastError();
      pending_frees_.pop_front();
      spare_events_.push_back(event);
      allocator().Free(offset).IgnoreError();
      freed = true;
    }
    return freed;
  }

 private:
  // An event of the slot's device (current on this thread) from the spares, or a new one; nullptr
  // when CUDA cannot create one.
  cudaEvent_t TakeEvent() {
    {
      absl::MutexLock lock(&free_mu_);
      if (!spare_events_.empty()) {
        cudaEvent_t event = spare_events_.back();
        spare_events_.pop_back();
        return event;
      }
    }
    cudaEvent_t event = nullptr;
    if (cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    return event;
  }

  void ReturnEvent(cudaEvent_t event) {
    absl::MutexLock lock(&free_mu_);
    spare_events_.push_back(event);
  }

  const int device_;
  std::vector<cudaEvent_t> done_;   // set by Open, then read only
  std::vector<cudaEvent_t> ready_;  // set by Open, then read only
  std::vector<std::string> ready_handles_;

  absl::Mutex ready_mu_;
  std::vector<uint8_t> ready_busy_ ABSL_GUARDED_BY(ready_mu_);  // per ready event
  size_t next_ready_ ABSL_GUARDED_BY(ready_mu_) = 0;

  absl::Mutex free_mu_;
  // Staged memory whose copy out is queued on a stream, with the event that marks its end.
  std::deque<std::pair<size_t, cudaEvent_t>> pending_frees_ ABSL_GUARDED_BY(free_mu_);
  std::vector<cudaEvent_t> spare_events_ ABSL_GUARDED_BY(free_mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<Staging>> OpenDeviceStaging(const DeviceArena& arena) {
  if (absl::Status s = LoadCudaRuntime(); !s.ok()) return s;
  int device = arena.device;
  if (!arena.pci_bus_id.empty()) {
    int ordinal = -1;
    if (absl::Status s = CudaError(cudaDeviceGetByPCIBusId(&ordinal, arena.pci_bus_id.c_str()),
                                   "finding the worker's GPU by its PCI bus id (is it visible to "
                                   "this process?)");
        !s.ok()) {
      return s;
    }
    device = ordinal;
  }
  if (absl::Status s = CudaError(cudaSetDevice(device), "cudaSetDevice"); !s.ok()) return s;
  cudaIpcMemHandle_t handle;
  if (arena.arena_handle.size() != sizeof(handle)) {
    return absl::InternalError("the worker's device arena handle has the wrong size");
  }
  std::memcpy(&handle, arena.arena_handle.data(), sizeof(handle));
  void* base = nullptr;
  if (absl::Status s =
          CudaError(cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess),
                    "opening the worker's device arena (same GPU, shared IPC "
                    "namespace?)");
      !s.ok()) {
    return s;
  }
  // From here the staging owns the mapping (its destructor closes it, and the events opened).
  auto staging = std::make_unique<CudaStaging>(device, static_cast<uint8_t*>(base), arena.bytes);
  if (absl::Status s = staging->Open(arena); !s.ok()) return s;
  return staging;
}

}  // namespace ringmaster
