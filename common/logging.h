// Process-wide logging setup (spdlog). Called once from main().
#pragma once

#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "spdlog/fmt/fmt.h"

namespace ringmaster {

// Sets spdlog's default logger to stderr with `level`: trace, debug, info, warning (Horovod's
// default), error, fatal/critical, off. Case-insensitive. INVALID_ARGUMENT for anything else.
absl::Status InitLogging(absl::string_view level);

// Abseil's mutex deadlock detection, from RINGMASTER_MUTEX_DEADLOCK_DETECTION: "abort" (a lock
// taken in an order that contradicts one seen before aborts the process, printing both stacks),
// "report" (it is printed and the process goes on), or off (unset or anything else; the default:
// detection costs every lock a graph update). The tests that run the binaries set "abort".
void ConfigureDeadlockDetection();

}  // namespace ringmaster

// Lets spdlog format absl::string_view (Debian's Abseil does not alias it to std::string_view).
template <>
struct fmt::formatter<absl::string_view> : fmt::formatter<fmt::string_view> {
  auto format(absl::string_view s, fmt::format_context& ctx) const {
    return fmt::formatter<fmt::string_view>::format(fmt::string_view(s.data(), s.size()), ctx);
  }
};
