// Command-line flags: Abseil's parser wants --snake_case names; users type --kebab-case. This rewrites
// each "--some-flag[=v]" to "--some_flag[=v]" (up to a lone "--") before absl::ParseCommandLine.
#pragma once

#include <string>
#include <vector>

namespace ringmaster {

class KebabFlags {
 public:
  KebabFlags(int argc, char** argv);
  int argc() { return static_cast<int>(pointers_.size()); }
  char** argv() { return pointers_.data(); }

 private:
  std::vector<std::string> storage_;
  std::vector<char*> pointers_;
};

}  // namespace ringmaster
