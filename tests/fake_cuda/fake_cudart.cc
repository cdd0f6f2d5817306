// A stand-in for the CUDA runtime (libcudart.so.13) on machines without a GPU, so the GPU data
// plane's plumbing runs end to end in CI: put its directory first on LD_LIBRARY_PATH and the
// project's own, unchanged binaries use it (tests/fake_cuda/README.md).
//
// "Device" memory is host memory in memfd objects, so CUDA IPC works between processes (a handle
// names the owner's pid and fd; the other process maps /proc/PID/fd/FD). Every stream is
// synchronous: a copy, a memset or a kernel has happened when the call returns, so events are
// always complete and stream waits are no-ops; that keeps the cross-process order the real
// asynchronous one must also give. The one kernel the project launches, the pack/unpack kernel
// (worker/gpu/fusion_kernels.cu), runs as a CPU reimplementation chosen by its registered name.
// FAKE_CUDA_DEVICES sets the device count (default 1), FAKE_CUDA_COMPUTE_MODE their compute mode.
// Only the calls the project makes exist.
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "common/half.h"
#include "worker/gpu/fusion_kernels.h"

namespace {

thread_local int current_device = 0;
thread_local cudaError_t last_error = cudaSuccess;

int DeviceCount() {
  const char* n = std::getenv("FAKE_CUDA_DEVICES");
  return n != nullptr ? std::atoi(n) : 1;
}

cudaError_t Fail(cudaError_t e) {
  last_error = e;
  return e;
}

// A mapping of fake device memory: the allocation (owned) or an opened IPC handle.
struct Mapping {
  size_t bytes = 0;
  int fd = -1;  // owned allocations keep their memfd open (others open it through /proc)
};
std::mutex mappings_mu;
std::map<void*, Mapping>& Mappings() {
  static auto* m = new std::map<void*, Mapping>;
  return *m;
}

struct IpcMem {
  int32_t pid;
  int32_t fd;
  uint64_t bytes;
};
static_assert(sizeof(IpcMem) <= sizeof(cudaIpcMemHandle_t));

void* Map(int fd, size_t bytes) {
  void* p = mmap(nullptr, bytes == 0 ? 1 : bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return p == MAP_FAILED ? nullptr : p;
}

// The pack/unpack kernel, on the CPU, with the same arithmetic (fusion_kernels.cu).
struct Batch {
  ringmaster::DeviceSegment segments[ringmaster::kMaxSegmentsPerLaunch];
  int64_t first_block[ringmaster::kMaxSegmentsPerLaunch + 1];
  int n;
};

template <typename T>
T ScaleOne(T v, double scale, int divide_by) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(scale / divide_by * static_cast<double>(v));  // as Horovod: truncated
  } else if constexpr (std::is_same_v<T, double>) {
    return v * (scale / divide_by);
  } else {
    return v * static_cast<float>(scale / divide_by);
  }
}

struct Half {
  uint16_t bits;
};
struct Bf16 {
  uint16_t bits;
};

template <typename T>
void ScaledCopy(const Batch& b, double scale, int divide_by) {
  for (int s = 0; s < b.n; ++s) {
    const auto* src = static_cast<const T*>(b.segments[s].src);
    auto* dst = static_cast<T*>(b.segments[s].dst);
    for (int64_t i = 0; i < b.segments[s].count; ++i) {
      if (src == nullptr) {
        dst[i] = T{};
      } else if constexpr (std::is_same_v<T, Half>) {
        dst[i].bits = ringmaster::FloatToHalf(
            ScaleOne<float>(ringmaster::HalfToFloat(src[i].bits), scale, divide_by));
      } else if constexpr (std::is_same_v<T, Bf16>) {
        dst[i].bits = ringmaster::FloatToBfloat16(
            ScaleOne<float>(ringmaster::Bfloat16ToFloat(src[i].bits), scale, divide_by));
      } else {
        dst[i] = ScaleOne<T>(src[i], scale, divide_by);
      }
    }
  }
}

std::mutex kernels_mu;
std::map<const void*, std::string>& Kernels() {
  static auto* k = new std::map<const void*, std::string>;
  return *k;
}

struct LaunchConfig {
  dim3 grid, block;
  size_t shared = 0;
  void* stream = nullptr;
};
thread_local std::vector<LaunchConfig> configs;

}  // namespace

struct CUevent_st {
  int device = 0;
};
struct CUstream_st {
  int device = 0;
};

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  *count = DeviceCount();
  return *count > 0 ? cudaSuccess : Fail(cudaErrorNoDevice);
}
cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= DeviceCount()) return Fail(cudaErrorInvalidDevice);
  current_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = current_device;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device < 0 || device >= DeviceCount()) return Fail(cudaErrorInvalidDevice);
  // FAKE_CUDA_COMPUTE_MODE: the devices' compute mode (default 0, cudaComputeModeDefault).
  const char* mode = std::getenv("FAKE_CUDA_COMPUTE_MODE");
  *value = attr == cudaDevAttrComputeMode && mode != nullptr ? std::atoi(mode) : 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetPCIBusId(char* bus_id, int len, int device) {
  if (device < 0 || device >= DeviceCount()) return Fail(cudaErrorInvalidDevice);
  std::snprintf(bus_id, static_cast<size_t>(len), "0000:%02X:00.0", device + 1);
  return cudaSuccess;
}
cudaError_t cudaDeviceGetByPCIBusId(int* device, const char* bus_id) {
  unsigned domain = 0, bus = 0;
  if (std::sscanf(bus_id, "%x:%x", &domain, &bus) != 2 || bus < 1 ||
      static_cast<int>(bus) > DeviceCount()) {
    return Fail(cudaErrorInvalidDevice);
  }
  *device = static_cast<int>(bus) - 1;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
cudaError_t cudaRuntimeGetVersion(int* v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaGetLastError() {
  const cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal (fake CUDA)";
    case cudaErrorMemoryAllocation:
      return "out of memory (fake CUDA)";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected (fake CUDA)";
    case cudaErrorInvalidValue:
      return "invalid argument (fake CUDA)";
    case cudaErrorMapBufferObjectFailed:
      return "mapping failed (fake CUDA)";
    default:
      return "unknown error (fake CUDA)";
  }
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  const int fd = memfd_create("fake-cuda", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes == 0 ? 1 : bytes)) != 0) {
    if (fd >= 0) close(fd);
    return Fail(cudaErrorMemoryAllocation);
  }
  *p = Map(fd, bytes);
  if (*p == nullptr) {
    close(fd);
    return Fail(cudaErrorMemoryAllocation);
  }
  std::lock_guard lock(mappings_mu);
  Mappings()[*p] = {bytes, fd};
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;  // creates the context on a real GPU
  std::lock_guard lock(mappings_mu);
  auto it = Mappings().find(p);
  if (it == Mappings().end()) return Fail(cudaErrorInvalidValue);
  munmap(p, it->second.bytes == 0 ? 1 : it->second.bytes);
  close(it->second.fd);
  Mappings().erase(it);
  return cudaSuccess;
}
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* p) {
  std::lock_guard lock(mappings_mu);
  auto it = Mappings().find(p);
  if (it == Mappings().end() || it->second.fd < 0) return Fail(cudaErrorInvalidValue);
  std::memset(handle, 0, sizeof(*handle));
  const IpcMem m{static_cast<int32_t>(getpid()), it->second.fd, it->second.bytes};
  std::memcpy(handle, &m, sizeof(m));
  return cudaSuccess;
}
cudaError_t cudaIpcOpenMemHandle(void** p, cudaIpcMemHandle_t handle, unsigned int) {
  IpcMem m;
  std::memcpy(&m, &handle, sizeof(m));
  const std::string path = "/proc/" + std::to_string(m.pid) + "/fd/" + std::to_string(m.fd);
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return Fail(cudaErrorMapBufferObjectFailed);
  *p = Map(fd, m.bytes);
  close(fd);
  if (*p == nullptr) return Fail(cudaErrorMapBufferObjectFailed);
  std::lock_guard lock(mappings_mu);
  Mappings()[*p] = {m.bytes, -1};
  return cudaSuccess;
}
cudaError_t cudaIpcCloseMemHandle(void* p) {
  std::lock_guard lock(mappings_mu);
  auto it = Mappings().find(p);
  if (it == Mappings().end()) return Fail(cudaErrorInvalidValue);
  munmap(p, it->second.bytes == 0 ? 1 : it->second.bytes);
  Mappings().erase(it);
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  std::memset(a, 0, sizeof(*a));
  std::lock_guard lock(mappings_mu);
  for (const auto& [base, m] : Mappings()) {
    const auto* b = static_cast<const uint8_t*>(base);
    const auto* q = static_cast<const uint8_t*>(p);
    if (q >= b && q < b + (m.bytes == 0 ? 1 : m.bytes)) {
      a->type = cudaMemoryTypeDevice;
      a->devicePointer = const_cast<void*>(p);
      return cudaSuccess;
    }
  }
  a->type = cudaMemoryTypeUnregistered;
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind,
                            cudaStream_t) {
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  std::memset(p, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) {
  *s = new CUstream_st{current_device};
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete s;
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned int) { return cudaSuccess; }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) {
  *e = new CUevent_st{current_device};
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) {
  *ms = 0;  // synchronous streams: the work between two events took no time on them
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t* handle, cudaEvent_t) {
  std::memset(handle, 0, sizeof(*handle));
  return cudaSuccess;
}
cudaError_t cudaIpcOpenEventHandle(cudaEvent_t* e, cudaIpcEventHandle_t) {
  *e = new CUevent_st{current_device};
  return cudaSuccess;
}

// What nvcc's generated host code calls to register and launch kernels.
void** __cudaRegisterFatBinary(void*) {
  static void* handle = nullptr;
  return &handle;
}
void __cudaRegisterFatBinaryEnd(void**) {}
void __cudaUnregisterFatBinary(void**) {}
void __cudaRegisterFunction(void**, const char* host_fun, char*, const char* device_name, int,
                            uint3*, uint3*, dim3*, dim3*, int*) {
  std::lock_guard lock(kernels_mu);
  Kernels()[host_fun] = device_name;
}
cudaError_t __cudaGetKernel(cudaKernel_t* kernel, const void* host_fun) {
  *kernel = reinterpret_cast<cudaKernel_t>(const_cast<void*>(host_fun));
  return cudaSuccess;
}
unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared, CUstream_st* stream) {
  configs.push_back({grid, block, shared, stream});
  return 0;
}
cudaError_t __cudaPopCallConfiguration(dim3* grid, dim3* block, size_t* shared, void* stream) {
  if (configs.empty()) return Fail(cudaErrorInvalidValue);
  *grid = configs.back().grid;
  *block = configs.back().block;
  *shared = configs.back().shared;
  *static_cast<void**>(stream) = configs.back().stream;
  configs.pop_back();
  return cudaSuccess;
}
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3, dim3, void** args, size_t, cudaStream_t) {
  std::string name;
  {
    std::lock_guard lock(kernels_mu);
    auto it = Kernels().find(reinterpret_cast<const void*>(kernel));
    if (it != Kernels().end()) name = it->second;
  }
  const size_t at = name.find("ScaledCopyKernelI");
  if (at == std::string::npos) {
    std::fprintf(stderr, "fake CUDA: no CPU version of kernel '%s'\n", name.c_str());
    return Fail(cudaErrorInvalidValue);
  }
  const std::string type = name.substr(at + 17);
  const Batch& batch = *static_cast<const Batch*>(args[0]);
  const double scale = *static_cast<const double*>(args[1]);
  const int divide_by = *static_cast<const int*>(args[2]);
  auto is = [&](const char* code) { return type.rfind(code, 0) == 0; };
  if (is("f"))
    ScaledCopy<float>(batch, scale, divide_by);
  else if (is("d"))
    ScaledCopy<double>(batch, scale, divide_by);
  else if (is("a"))
    ScaledCopy<int8_t>(batch, scale, divide_by);
  else if (is("h"))
    ScaledCopy<uint8_t>(batch, scale, divide_by);
  else if (is("i"))
    ScaledCopy<int32_t>(batch, scale, divide_by);
  else if (is("l"))
    ScaledCopy<int64_t>(batch, scale, divide_by);
  else if (is("6__half"))
    ScaledCopy<Half>(batch, scale, divide_by);
  else if (is("13__nv_bfloat16"))
    ScaledCopy<Bf16>(batch, scale, divide_by);
  else
    return Fail(cudaErrorInvalidValue);
  return cudaSuccess;
}

}  // extern "C"
