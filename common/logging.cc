#include "common/logging.h"

#include <cstdlib>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

namespace ringmaster {

void ConfigureDeadlockDetection() {
  const char* env = std::getenv("RINGMASTER_MUTEX_DEADLOCK_DETECTION");
  const std::string mode = env == nullptr ? "" : env;
  absl::SetMutexDeadlockDetectionMode(mode == "abort"    ? absl::OnDeadlockCycle::kAbort
                                      : mode == "report" ? absl::OnDeadlockCycle::kReport
                                                         : absl::OnDeadlockCycle::kIgnore);
}

absl::Status InitLogging(absl::string_view level) {
  std::string l = absl::AsciiStrToLower(level);
  spdlog::level::level_enum value;
  if (l == "trace") {
    value = spdlog::level::trace;
  } else if (l == "debug") {
    value = spdlog::level::debug;
  } else if (l == "info") {
    value = spdlog::level::info;
  } else if (l == "warning" || l == "warn") {
    value = spdlog::level::warn;
  } else if (l == "error") {
    value = spdlog::level::err;
  } else if (l == "fatal" || l == "critical") {
    value = spdlog::level::critical;
  } else if (l == "off") {
    value = spdlog::level::off;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--log-level '", level, "' is not one of trace, debug, info, warning, error, fatal, off"));
  }
  auto logger = spdlog::stderr_logger_mt("ringmaster");
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] %v");
  logger->set_level(value);
  spdlog::set_default_logger(logger);
  return absl::OkStatus();
}

}  // namespace ringmaster
