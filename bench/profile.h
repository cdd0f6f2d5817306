// A model's gradient tensors (names and shapes, in backward order), read from the JSON profiles in
// bench/profiles/.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ringmaster {

struct ModelProfile {
  std::string model;
  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
    int64_t Elements() const {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      return n;
    }
  };
  std::vector<Tensor> tensors;
  int64_t bytes_fp32 = 0;
};

absl::StatusOr<ModelProfile> LoadProfile(const std::string& path);

}  // namespace ringmaster
