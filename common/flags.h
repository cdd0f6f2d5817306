// Command-line flags: Abseil's parser wants --snake_case names; users type --kebab-case. This
// rewrites each "--some-flag[=v]" to "--some_flag[=v]" (up to a lone "--") before
// absl::ParseCommandLine.
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

// When argv asks for help (--help or -h, before any lone "--"), prints `usage`, then every flag
// defined in a source file whose path ends with `flags_file` (e.g. "coordinator/main.cc") with its
// name in dashes, its default and its help text, and exits 0. Returns otherwise.
void HandleHelp(int argc, char** argv, const std::string& usage, const std::string& flags_file);

// The help text HandleHelp prints.
std::string HelpText(const std::string& usage, const std::string& flags_file);

}  // namespace ringmaster
