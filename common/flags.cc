#include "common/flags.h"

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

}  // namespace ringmaster
