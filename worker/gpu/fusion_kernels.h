// Packing and unpacking a fused response on the GPU: one kernel launch moves up to
// kMaxSegmentsPerLaunch tensors (more take more launches), applying the pre- or postscale factor
// (and, for integer averages, the division) on the way, so scaling costs no extra pass over memory.
// A null source fills the destination with zeros (a joined rank's contribution); source and
// destination may be the same (scaling in place).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "common/tensor.h"
#include "cuda_runtime_api.h"

namespace ringmaster {

struct DeviceSegment {
  const void* src = nullptr;  // null: zeros
  void* dst = nullptr;
  int64_t count = 0;  // elements
};

inline constexpr int kMaxSegmentsPerLaunch = 96;

// Enqueues dst[i] = src[i] * scale / divide_by for every segment on `stream` (floating types are
// scaled in float (double for float64) and rounded to the type; integers are multiplied by
// scale / divide_by in double and truncated toward zero, as Horovod and the CPU executor do, so
// 71 * 0.5 is 35 in int8 on either device).
// INTERNAL with CUDA's message when a launch fails. Asynchronous: nothing waits for the GPU.
absl::Status ScaledCopy(const std::vector<DeviceSegment>& segments, DataType dtype, double scale,
                        int divide_by, cudaStream_t stream);

}  // namespace ringmaster
