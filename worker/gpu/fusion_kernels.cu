#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "worker/gpu/fusion_kernels.h"

namespace ringmaster {
namespace {

constexpr int kThreads = 256;
// Each block moves 16 KiB: on the vector path, four 16-byte loads per thread, all issued before any
// store (64 bytes in flight per thread, enough to keep HBM busy; also correct in place).
constexpr int kBytesPerBlock = 16384;
constexpr int kVectorsPerThread = kBytesPerBlock / 16 / kThreads;
static_assert(kVectorsPerThread * 16 * kThreads == kBytesPerBlock);
template <typename T>
constexpr int64_t kElementsPerBlock = kBytesPerBlock / sizeof(T);

struct Batch {
  DeviceSegment segments[kMaxSegmentsPerLaunch];
  // First block of each segment; first_block[n] is the total.
  int64_t first_block[kMaxSegmentsPerLaunch + 1];
  int n;
};
static_assert(sizeof(Batch) <= 4096, "kernel parameters are limited to 4 KiB");

template <typename T>
struct Convert {
  using Compute = float;
  __device__ static float In(T v) { return static_cast<float>(v); }
  __device__ static T Out(float v) { return static_cast<T>(v); }
};
template <>
struct Convert<double> {
  using Compute = double;
  __device__ static double In(double v) { return v; }
  __device__ static double Out(double v) { return v; }
};
template <>
struct Convert<__half> {
  using Compute = float;
  __device__ static float In(__half v) { return __half2float(v); }
  __device__ static __half Out(float v) { return __float2half_rn(v); }
};
template <>
struct Convert<__nv_bfloat16> {
  using Compute = float;
  __device__ static float In(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 Out(float v) { return __float2bfloat16_rn(v); }
};

template <typename T>
__device__ T ScaleOne(T v, double scale, int divide_by) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(scale / divide_by * static_cast<double>(v));  // as Horovod: truncated
  } else {
    using C = typename Convert<T>::Compute;
    return Convert<T>::Out(Convert<T>::In(v) * static_cast<C>(scale / divide_by));
  }
}

template <typename T>
__global__ void ScaledCopyKernel(Batch batch, double scale, int divide_by) {
  const int64_t block = blockIdx.x;
  int lo = 0, hi = batch.n - 1;  // the segment whose blocks include this one
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (batch.first_block[mid] <= block)
      lo = mid;
    else
      hi = mid - 1;
  }
  const DeviceSegment s = batch.segments[lo];
  const int64_t begin = (block - batch.first_block[lo]) * kElementsPerBlock<T>;
  const int64_t end =
      begin + kElementsPerBlock<T> < s.count ? begin + kElementsPerBlock<T> : s.count;
  const T* src = static_cast<const T*>(s.src);
  T* dst = static_cast<T*>(s.dst);
  const bool plain = scale == 1.0 && divide_by == 1;
  const bool aligned =
      ((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) & 15) == 0;
  if (aligned && end - begin == kElementsPerBlock<T>) {
    // A whole block of 16-byte-aligned data: vector loads, then the scaling in registers.
    constexpr int kLanes = 16 / sizeof(T);
    const uint4* in = reinterpret_cast<const uint4*>(src + begin);
    uint4* out = reinterpret_cast<uint4*>(dst + begin);
    uint4 v[kVectorsPerThread];
#pragma unroll
    for (int k = 0; k < kVectorsPerThread; ++k) {
      v[k] = src == nullptr ? make_uint4(0, 0, 0, 0) : in[threadIdx.x + k * kThreads];
    }
    if (!plain && src != nullptr) {
#pragma unroll
      for (int k = 0; k < kVectorsPerThread; ++k) {
        T lanes[kLanes];
        memcpy(lanes, &v[k], 16);
#pragma unroll
        for (int j = 0; j < kLanes; ++j) lanes[j] = ScaleOne<T>(lanes[j], scale, divide_by);
        memcpy(&v[k], lanes, 16);
      }
    }
#pragma unroll
    for (int k = 0; k < kVectorsPerThread; ++k) out[threadIdx.x + k * kThreads] = v[k];
    return;
  }
  // The last, partial block of a segment, or data not 16-byte aligned: element by element.
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    if (src == nullptr) {
      dst[i] = T{};
    } else {
      dst[i] = plain ? src[i] : ScaleOne<T>(src[i], scale, divide_by);
    }
  }
}

template <typename T>
absl::Status Launch(const std::vector<DeviceSegment>& segments, double scale, int divide_by,
                    cudaStream_t stream) {
  size_t i = 0;
  while (i < segments.size()) {
    Batch batch{};
    int64_t blocks = 0;
    batch.n = 0;
    for (; i < segments.size() && batch.n < kMaxSegmentsPerLaunch; ++i) {
      if (segments[i].count <= 0) continue;
      batch.segments[batch.n] = segments[i];
      batch.first_block[batch.n] = blocks;
      blocks += (segments[i].count + kElementsPerBlock<T> - 1) / kElementsPerBlock<T>;
      ++batch.n;
    }
    batch.first_block[batch.n] = blocks;
    if (blocks == 0) continue;
    // Grids are limited to 2^31-1 blocks in x: 8 TiB of float32 per launch, far past any buffer.
    ScaledCopyKernel<T>
        <<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(batch, scale, divide_by);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) {
      return absl::InternalError(std::string("pack/unpack kernel launch failed: ") +
                                 cudaGetErrorString(e));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ScaledCopy(const std::vector<DeviceSegment>& segments, DataType dtype, double scale,
                        int divide_by, cudaStream_t stream) {
  switch (dtype) {
    case DataType::kUint8:
      return Launch<uint8_t>(segments, scale, divide_by, stream);
    case DataType::kInt8:
      return Launch<int8_t>(segments, scale, divide_by, stream);
    case DataType::kInt32:
      return Launch<int32_t>(segments, scale, divide_by, stream);
    case DataType::kInt64:
      return Launch<int64_t>(segments, scale, divide_by, stream);
    case DataType::kFloat16:
      return Launch<__half>(segments, scale, divide_by, stream);
    case DataType::kBfloat16:
      return Launch<__nv_bfloat16>(segments, scale, divide_by, stream);
    case DataType::kFloat32:
      return Launch<float>(segments, scale, divide_by, stream);
    case DataType::kFloat64:
      return Launch<double>(segments, scale, divide_by, stream);
    case DataType::kUnspecified:
      break;
  }
  return absl::InvalidArgumentError("pack/unpack: unspecified data type");
}

}  // namespace ringmaster
