#include "worker/gpu/fusion_layout.h"

#include "absl/strings/str_cat.h"

namespace ringmaster {

absl::StatusOr<FusionLayout> PlanFusion(const std::vector<int64_t>& tensor_bytes,
                                        int64_t element_size, int64_t alignment) {
  if (element_size <= 0 || alignment <= 0 || (alignment & (alignment - 1)) != 0 ||
      alignment < element_size || alignment % element_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("fusion alignment ", alignment,
                                                   " must be a power of two and a multiple of the ",
                                                   element_size, "-byte element"));
  }
  constexpr int64_t kMaxTotal = int64_t{1} << 62;
  FusionLayout layout;
  layout.offsets.reserve(tensor_bytes.size());
  layout.bytes = tensor_bytes;
  int64_t at = 0, payload = 0;
  for (size_t i = 0; i < tensor_bytes.size(); ++i) {
    const int64_t b = tensor_bytes[i];
    if (b < 0 || b % element_size != 0) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", i, " of the fused response has ", b,
                                                     " bytes, not a whole number of ", element_size,
                                                     "-byte elements"));
    }
    if (b > kMaxTotal - at) {
      return absl::InvalidArgumentError("the fused response is larger than 2^62 bytes");
    }
    layout.offsets.push_back(at);
    payload += b;
    at += (b + alignment - 1) / alignment * alignment;
  }
  layout.total_bytes = at;
  layout.padding_bytes = at - payload;
  return layout;
}

}  // namespace ringmaster
