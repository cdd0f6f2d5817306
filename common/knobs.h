// A job's tuning knobs with Horovod's names and defaults, their bounds, and the HOROVOD_*
// environment aliases. Plain data; parsing happens once, where a process starts (CLI, daemon),
// never deep in logic.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ringmaster {

enum class Backend : int32_t { kAuto = 0, kGloo = 1, kNccl = 2 };

struct Knobs {
  int64_t fusion_threshold_bytes = int64_t{128} << 20;  // 0 disables fusion
  double cycle_time_ms = 1.0;
  int32_t cache_capacity = 1024;  // 0 disables the response cache
  bool autotune = false;
  int32_t autotune_warmup_samples = 3;
  int32_t autotune_steps_per_sample = 10;
  int32_t autotune_bayes_opt_max_samples = 20;
  double autotune_gaussian_process_noise = 0.8;
  std::string autotune_log;
  std::string timeline;
  bool timeline_mark_cycles = false;
  double stall_check_seconds = 60.0;    // 0 disables the stall inspector
  double stall_shutdown_seconds = 0.0;  // 0: never shut down on a stall
  Backend backend = Backend::kAuto;
  // CPU allreduce among a host's ranks through shared memory (worker/shm_group.h).
  bool shm_allreduce = true;
  // ... and across hosts among the ranks of one local index (hierarchical allreduce).
  bool hierarchical_allreduce = true;
  // ... and allgather across hosts likewise (hierarchical allgather).
  bool hierarchical_allgather = true;
  // A one-host CPU job's lone cached allreduce is negotiated through shared memory.
  bool local_negotiation = true;
  // A host's ranks negotiate through one of its daemons (the negotiation relay).
  bool negotiation_relay = false;
  // ... with a relay for this many hosts (their ranks' links cross hosts over TCP when above 1).
  int32_t negotiation_relay_hosts = 1;
  // What the coordinator does when it names a rank as holding the job back
  // (docs/operations.md, "Finding a slow rank"): "none", "warn" (a job event), "fail" (the job
  // fails naming it) or "evict" (an elastic job drops it and goes on in a new epoch, its host kept
  // out of the job for straggler_cooldown_seconds).
  std::string straggler_action = "none";
  double straggler_cooldown_seconds = 300;
  // Knobs autotune leaves alone (kTunableKnobs names).
  std::vector<std::string> autotune_fixed;
};

// The knobs autotune moves, by name.
inline constexpr const char* kTunableKnobs[] = {"fusion_threshold_bytes", "cycle_time_ms",
                                                "cache_capacity"};

// Bounds, as documented in proto/ringmaster/v1/job.proto.
inline constexpr int64_t kMaxFusionThresholdBytes = int64_t{16} << 30;
inline constexpr double kMaxCycleTimeMs = 10'000;
inline constexpr int32_t kMaxCacheCapacity = 1 << 20;
inline constexpr double kMaxStallSeconds = 86'400;
inline constexpr int32_t kMaxNegotiationRelayHosts = 64;

// INVALID_ARGUMENT naming the first knob out of bounds, e.g. "knobs.cycle_time_ms = -1 is out of
// bounds (0, 10000]".
absl::Status ValidateKnobs(const Knobs& knobs);

// OK when `name` can be a job artifact's file name: 1..255 bytes of [A-Za-z0-9._-], not "." or
// "..". INVALID_ARGUMENT naming `field` otherwise.
absl::Status ValidateArtifactName(absl::string_view field, const std::string& name);

// Looks up an environment variable; nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(absl::string_view)>;
EnvLookup ProcessEnv();

// Overrides `knobs` from Horovod's environment variables (HOROVOD_FUSION_THRESHOLD in bytes,
// HOROVOD_CYCLE_TIME in ms, HOROVOD_CACHE_CAPACITY, HOROVOD_AUTOTUNE, HOROVOD_AUTOTUNE_LOG,
// HOROVOD_AUTOTUNE_WARMUP_SAMPLES, HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE,
// HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES, HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE,
// HOROVOD_TIMELINE, HOROVOD_TIMELINE_MARK_CYCLES, HOROVOD_STALL_CHECK_TIME_SECONDS,
// HOROVOD_STALL_CHECK_DISABLE, HOROVOD_STALL_SHUTDOWN_TIME_SECONDS,
// HOROVOD_HIERARCHICAL_ALLREDUCE, and Ringmaster's own RINGMASTER_SHM_ALLREDUCE and
// RINGMASTER_LOCAL_NEGOTIATION). Each also reads
// as RINGMASTER_*, which wins over HOROVOD_*. INVALID_ARGUMENT names the variable whose value does
// not parse.
absl::Status ApplyEnvironment(const EnvLookup& env, Knobs* knobs);

absl::string_view BackendName(Backend backend);

}  // namespace ringmaster
