// Where each tensor of a fused response goes in a device fusion buffer: back to back in response
// order, each starting at a multiple of the alignment, so the pack/unpack kernel moves aligned
// vectors and NCCL works on an aligned buffer. The gaps (padding) are part of the reduced buffer
// but never copied out. Plain arithmetic: no CUDA needed, tested on every machine.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace ringmaster {

// Default alignment of tensors in the device fusion buffer, in bytes.
inline constexpr int64_t kFusionAlignment = 256;

struct FusionLayout {
  std::vector<int64_t> offsets;  // bytes from the buffer's start, one per tensor
  std::vector<int64_t> bytes;    // each tensor's own size
  int64_t total_bytes = 0;       // end of the last tensor, rounded up to the alignment
  int64_t padding_bytes = 0;     // total_bytes minus the tensors' bytes

  // Elements of `element_size` bytes the collective runs over (total_bytes / element_size).
  int64_t Elements(int64_t element_size) const { return total_bytes / element_size; }
};

// INVALID_ARGUMENT for an alignment that is not a power of two or is smaller than `element_size`,
// a negative size, a size that is not a whole number of elements, or a total over 2^62 bytes.
absl::StatusOr<FusionLayout> PlanFusion(const std::vector<int64_t>& tensor_bytes,
                                        int64_t element_size, int64_t alignment = kFusionAlignment);

}  // namespace ringmaster
