#include "bench/profile.h"

#include <fstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace ringmaster {

absl::StatusOr<ModelProfile> LoadProfile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open profile ", path));
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.contains("tensors")) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a model profile"));
  }
  ModelProfile p;
  p.model = j.value("model", path);
  for (const auto& t : j["tensors"]) {
    ModelProfile::Tensor tensor;
    tensor.name = t.at("name").get<std::string>();
    tensor.shape = t.at("shape").get<std::vector<int64_t>>();
    int64_t n = 4;
    for (int64_t d : tensor.shape) n *= d;
    p.bytes_fp32 += n;
    p.tensors.push_back(std::move(tensor));
  }
  return p;
}

}  // namespace ringmaster
