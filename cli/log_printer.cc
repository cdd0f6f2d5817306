#include "cli/log_printer.h"

#include "absl/strings/str_cat.h"

namespace ringmaster::cli {
namespace {

void Emit(int rank, std::string_view line, std::string* out) {
  absl::StrAppend(out, "[", rank, "] ");
  out->append(line);
  out->push_back('\n');
}

}  // namespace

void LogPrinter::Write(int rank, bool to_stderr, std::string_view data) {
  if (data.empty()) return;
  if (!prefix_ranks_) {
    sink_(to_stderr, data);
    return;
  }
  std::string& partial = partial_[{rank, to_stderr}];
  std::string out;  // every complete line of this chunk, printed at once
  size_t start = 0;
  for (size_t nl = data.find('\n'); nl != std::string_view::npos; nl = data.find('\n', start)) {
    if (partial.empty()) {
      Emit(rank, data.substr(start, nl - start), &out);
    } else {
      partial.append(data.substr(start, nl - start));
      Emit(rank, partial, &out);
      partial.clear();
    }
    start = nl + 1;
  }
  partial.append(data.substr(start));
  if (partial.size() > kMaxPartialLine) {
    Emit(rank, partial, &out);
    partial.clear();
  }
  if (!out.empty()) sink_(to_stderr, out);
}

void LogPrinter::Flush() {
  for (auto& [key, partial] : partial_) {
    if (partial.empty()) continue;
    std::string out;
    Emit(key.first, partial, &out);
    partial.clear();
    sink_(key.second, out);
  }
}

}  // namespace ringmaster::cli
