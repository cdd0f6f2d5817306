#include "common/flags.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace ringmaster {

KebabFlags::KebabFlags(int argc, char** argv) : storage_(argv, argv + argc) {
  bool done = false;
  for (size_t i = 1; i < storage_.size(); ++i) {
    std::string& arg = storage_[i];
    if (arg == "--") done = true;
    if (done || arg.rfind("--", 0) != 0) continue;
    const size_t end = std::min(arg.find('='), arg.size());
    for (size_t j = 2; j < end; ++j) {
      if (arg[j] == '-') arg[j] = '_';
    }
  }
  for (std::string& s : storage_) pointers_.push_back(s.data());
  pointers_.push_back(nullptr);
  pointers_.pop_back();
}

std::string HelpText(const std::string& usage, const std::string& flags_file) {
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (absl::EndsWith(flag->Filename(), flags_file)) flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(),
            [](const auto* a, const auto* b) { return a->Name() < b->Name(); });
  std::string out = absl::StrCat("usage: ", usage, "\n\nflags:\n");
  for (const absl::CommandLineFlag* flag : flags) {
    std::string name = absl::StrReplaceAll(flag->Name(), {{"_", "-"}});
    std::string value = flag->IsOfType<bool>() ? "" : " VALUE";
    std::string def = flag->DefaultValue();
    absl::StrAppend(&out, "  --", name, value, "\n      ", flag->Help());
    // A help text that states its default already says it better than the raw value.
    if (!absl::StrContains(flag->Help(), "default")) {
      absl::StrAppend(&out, " (default: ", def.empty() ? "\"\"" : def, ")");
    }
    absl::StrAppend(&out, "\n");
  }
  absl::StrAppend(&out, "  --help\n      print this help and exit\n");
  return out;
}

void HandleHelp(int argc, char** argv, const std::string& usage, const std::string& flags_file) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) return;
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::fputs(HelpText(usage, flags_file).c_str(), stdout);
      std::exit(0);
    }
  }
}

}  // namespace ringmaster
