#include "common/knobs.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace ringmaster {
namespace {

// A template, so integer knobs print exactly ("17179869185", not "1.71799e+10").
template <typename T>
absl::Status OutOfBounds(absl::string_view field, T value, absl::string_view bounds) {
  return absl::InvalidArgumentError(
      absl::StrCat("knobs.", field, " = ", value, " is out of bounds ", bounds));
}

// The value of RINGMASTER_<suffix>, else HOROVOD_<suffix>, with the variable's name.
std::optional<std::pair<std::string, std::string>> Lookup(const EnvLookup& env,
                                                          absl::string_view suffix) {
  for (absl::string_view prefix : {"RINGMASTER_", "HOROVOD_"}) {
    std::string var = absl::StrCat(prefix, suffix);
    if (std::optional<std::string> value = env(var); value.has_value()) {
      return std::make_pair(var, *value);
    }
  }
  return std::nullopt;
}

absl::Status BadValue(absl::string_view var, absl::string_view value, absl::string_view expected) {
  return absl::InvalidArgumentError(
      absl::StrCat("environment variable ", var, "='", value, "' is not ", expected));
}

absl::Status ReadInt64(const EnvLookup& env, absl::string_view suffix, int64_t* out) {
  auto found = Lookup(env, suffix);
  if (!found) return absl::OkStatus();
  if (!absl::SimpleAtoi(found->second, out)) {
    return BadValue(found->first, found->second, "an integer");
  }
  return absl::OkStatus();
}

absl::Status ReadInt32(const EnvLookup& env, absl::string_view suffix, int32_t* out) {
  int64_t value = *out;
  if (absl::Status s = ReadInt64(env, suffix, &value); !s.ok()) return s;
  *out = static_cast<int32_t>(value);
  return absl::OkStatus();
}

absl::Status ReadDouble(const EnvLookup& env, absl::string_view suffix, double* out) {
  auto found = Lookup(env, suffix);
  if (!found) return absl::OkStatus();
  if (!absl::SimpleAtod(found->second, out))
    return BadValue(found->first, found->second, "a number");
  return absl::OkStatus();
}

absl::Status ReadBool(const EnvLookup& env, absl::string_view suffix, bool* out) {
  auto found = Lookup(env, suffix);
  if (!found) return absl::OkStatus();
  std::string v = absl::AsciiStrToLower(found->second);
  if (v == "1" || v == "true" || v == "yes" || v == "on") {
    *out = true;
  } else if (v == "0" || v == "false" || v == "no" || v == "off" || v.empty()) {
    *out = false;
  } else {
    return BadValue(found->first, found->second, "a boolean (1/0, true/false)");
  }
  return absl::OkStatus();
}

void ReadString(const EnvLookup& env, absl::string_view suffix, std::string* out) {
  if (auto found = Lookup(env, suffix)) *out = found->second;
}

}  // namespace

absl::Status ValidateArtifactName(absl::string_view field, const std::string& name) {
  const bool plain = std::all_of(name.begin(), name.end(), [](char c) {
    return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-';
  });
  if (name.empty() || name.size() > 255 || !plain || name == "." || name == "..") {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " = '", name,
        "' is not a file name: use 1..255 letters, digits, '.', '_' or '-' (no directories: the "
        "coordinator keeps the file as a job artifact; fetch it with `ringmaster artifacts JOB`)"));
  }
  if (absl::StartsWith(name, "rank-")) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " = '", name,
                     "' begins with 'rank-', which names the ranks' output directories among the "
                     "job's artifacts"));
  }
  return absl::OkStatus();
}

absl::Status ValidateKnobs(const Knobs& k) {
  if (k.fusion_threshold_bytes < 0 || k.fusion_threshold_bytes > kMaxFusionThresholdBytes) {
    return OutOfBounds("fusion_threshold_bytes", k.fusion_threshold_bytes, "[0, 17179869184]");
  }
  if (!(k.cycle_time_ms > 0 && k.cycle_time_ms <= kMaxCycleTimeMs)) {
    return OutOfBounds("cycle_time_ms", k.cycle_time_ms, "(0, 10000]");
  }
  if (k.cache_capacity < 0 || k.cache_capacity > kMaxCacheCapacity) {
    return OutOfBounds("cache_capacity", k.cache_capacity, "[0, 1048576]");
  }
  if (k.negotiation_relay_hosts < 1 || k.negotiation_relay_hosts > kMaxNegotiationRelayHosts) {
    return OutOfBounds("negotiation_relay_hosts", k.negotiation_relay_hosts, "[1, 64]");
  }
  if (k.autotune_warmup_samples < 0 || k.autotune_warmup_samples > 1000) {
    return OutOfBounds("autotune_warmup_samples", k.autotune_warmup_samples, "[0, 1000]");
  }
  if (k.autotune_steps_per_sample < 1 || k.autotune_steps_per_sample > 100'000) {
    return OutOfBounds("autotune_steps_per_sample", k.autotune_steps_per_sample, "[1, 100000]");
  }
  if (k.autotune_bayes_opt_max_samples < 1 || k.autotune_bayes_opt_max_samples > 100) {
    return OutOfBounds("autotune_bayes_opt_max_samples", k.autotune_bayes_opt_max_samples,
                       "[1, 100]");
  }
  if (!(k.autotune_gaussian_process_noise >= 0 && k.autotune_gaussian_process_noise <= 100)) {
    return OutOfBounds("autotune_gaussian_process_noise", k.autotune_gaussian_process_noise,
                       "[0, 100]");
  }
  if (!k.autotune_log.empty()) {
    if (absl::Status s = ValidateArtifactName("knobs.autotune_log", k.autotune_log); !s.ok()) {
      return s;
    }
  }
  if (!k.timeline.empty()) {
    if (absl::Status s = ValidateArtifactName("knobs.timeline", k.timeline); !s.ok()) return s;
    if (k.timeline == k.autotune_log) {
      return absl::InvalidArgumentError(absl::StrCat("knobs.autotune_log = '", k.autotune_log,
                                                     "' names the same file as knobs.timeline"));
    }
  }
  for (size_t i = 0; i < k.autotune_fixed.size(); ++i) {
    const std::string& name = k.autotune_fixed[i];
    if (std::find(std::begin(kTunableKnobs), std::end(kTunableKnobs), name) ==
        std::end(kTunableKnobs)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "knobs.autotune_fixed[", i, "] = '", name,
          "' is not a tunable knob (fusion_threshold_bytes, cycle_time_ms, cache_capacity)"));
    }
  }
  if (!(k.stall_check_seconds >= 0 && k.stall_check_seconds <= kMaxStallSeconds)) {
    return OutOfBounds("stall_check_seconds", k.stall_check_seconds, "[0, 86400]");
  }
  if (!(k.stall_shutdown_seconds >= 0 && k.stall_shutdown_seconds <= kMaxStallSeconds)) {
    return OutOfBounds("stall_shutdown_seconds", k.stall_shutdown_seconds, "[0, 86400]");
  }
  if (k.straggler_action != "none" && k.straggler_action != "warn" &&
      k.straggler_action != "fail" && k.straggler_action != "evict") {
    return absl::InvalidArgumentError(absl::StrCat("knobs.straggler_action = '", k.straggler_action,
                                                   "' is not none, warn, fail or evict"));
  }
  if (!(k.straggler_cooldown_seconds >= 0 && k.straggler_cooldown_seconds <= kMaxStallSeconds)) {
    return OutOfBounds("straggler_cooldown_seconds", k.straggler_cooldown_seconds, "[0, 86400]");
  }
  if (static_cast<int32_t>(k.backend) < 0 || static_cast<int32_t>(k.backend) > 2) {
    return OutOfBounds("backend", static_cast<int32_t>(k.backend), "{AUTO, GLOO, NCCL}");
  }
  return absl::OkStatus();
}

EnvLookup ProcessEnv() {
  return [](absl::string_view name) -> std::optional<std::string> {
    const char* value = std::getenv(std::string(name).c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

absl::Status ApplyEnvironment(const EnvLookup& env, Knobs* k) {
  bool stall_check_disable = false;
  for (absl::Status s : {
           ReadInt64(env, "FUSION_THRESHOLD", &k->fusion_threshold_bytes),
           ReadDouble(env, "CYCLE_TIME", &k->cycle_time_ms),
           ReadInt32(env, "CACHE_CAPACITY", &k->cache_capacity),
           ReadBool(env, "AUTOTUNE", &k->autotune),
           ReadInt32(env, "AUTOTUNE_WARMUP_SAMPLES", &k->autotune_warmup_samples),
           ReadInt32(env, "AUTOTUNE_STEPS_PER_SAMPLE", &k->autotune_steps_per_sample),
           ReadInt32(env, "AUTOTUNE_BAYES_OPT_MAX_SAMPLES", &k->autotune_bayes_opt_max_samples),
           ReadDouble(env, "AUTOTUNE_GAUSSIAN_PROCESS_NOISE", &k->autotune_gaussian_process_noise),
           ReadBool(env, "TIMELINE_MARK_CYCLES", &k->timeline_mark_cycles),
           ReadDouble(env, "STALL_CHECK_TIME_SECONDS", &k->stall_check_seconds),
           ReadDouble(env, "STALL_SHUTDOWN_TIME_SECONDS", &k->stall_shutdown_seconds),
           ReadBool(env, "STALL_CHECK_DISABLE", &stall_check_disable),
           ReadBool(env, "SHM_ALLREDUCE", &k->shm_allreduce),
           ReadBool(env, "LOCAL_NEGOTIATION", &k->local_negotiation),
           ReadBool(env, "HIERARCHICAL_ALLREDUCE", &k->hierarchical_allreduce),
           ReadBool(env, "HIERARCHICAL_ALLGATHER", &k->hierarchical_allgather),
           ReadBool(env, "NEGOTIATION_RELAY", &k->negotiation_relay),
           ReadInt32(env, "NEGOTIATION_RELAY_HOSTS", &k->negotiation_relay_hosts),
       }) {
    if (!s.ok()) return s;
  }
  ReadString(env, "AUTOTUNE_LOG", &k->autotune_log);
  ReadString(env, "TIMELINE", &k->timeline);
  ReadString(env, "STRAGGLER_ACTION", &k->straggler_action);
  if (absl::Status s =
          ReadDouble(env, "STRAGGLER_COOLDOWN_SECONDS", &k->straggler_cooldown_seconds);
      !s.ok()) {
    return s;
  }
  if (stall_check_disable) k->stall_check_seconds = 0;
  return absl::OkStatus();
}

absl::string_view BackendName(Backend backend) {
  switch (backend) {
    case Backend::kAuto:
      return "auto";
    case Backend::kGloo:
      return "gloo";
    case Backend::kNccl:
      return "nccl";
  }
  return "unknown";
}

}  // namespace ringmaster
