// Prints the output of a job's ranks the way horovodrun does: with every rank's output interleaved,
// each line is prefixed "[R] " and printed whole; a rank's partial line waits in a buffer (one per
// rank and stream) until its newline arrives, so lines of different ranks never mix mid-line.
// Without prefixes (one rank) output passes through as it comes.
//
// Not thread-safe: one thread feeds it.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>

namespace ringmaster::cli {

class LogPrinter {
 public:
  // Receives text to print on stdout (to_stderr false) or stderr: whole prefixed lines, or raw
  // output without prefixes.
  using Sink = std::function<void(bool to_stderr, std::string_view text)>;

  // A partial line longer than this is printed (as a line) rather than buffered further.
  static constexpr size_t kMaxPartialLine = 64 * 1024;

  LogPrinter(bool prefix_ranks, Sink sink) : prefix_ranks_(prefix_ranks), sink_(std::move(sink)) {}

  void Write(int rank, bool to_stderr, std::string_view data);
  // Prints every buffered partial line, ending it with a newline. Call when the output ends.
  void Flush();

 private:
  const bool prefix_ranks_;
  const Sink sink_;
  std::map<std::pair<int, bool>, std::string> partial_;  // (rank, to_stderr) -> unfinished line
};

}  // namespace ringmaster::cli
