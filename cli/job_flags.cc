#include "cli/job_flags.h"

#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/knobs.h"

extern char** environ;

namespace ringmaster::cli {

namespace {

// "dir/name.json" -> "name.json", remembering the path asked for.
std::string ArtifactName(const std::string& value,
                         std::map<std::string, std::string>* requested_paths) {
  const size_t slash = value.find_last_of('/');
  if (slash == std::string::npos) return value;
  const std::string name = value.substr(slash + 1);
  if (requested_paths != nullptr && !name.empty()) (*requested_paths)[name] = value;
  return name;
}

// An environment file as Docker reads one: KEY=VALUE per line (the value as written, '=' and
// quotes included), blank lines and lines starting with '#' skipped. A usage error names the line.
void ReadEnvFile(const std::string& path, v1::JobSpec* spec) {
  std::ifstream in(path);
  if (!in) Usage(absl::StrCat("--env-file ", path, ": cannot be read"));
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const absl::string_view text = absl::StripAsciiWhitespace(line);
    if (text.empty() || text[0] == '#') continue;
    const size_t eq = text.find('=');
    if (eq == 0 || eq == absl::string_view::npos) {
      Usage(absl::StrCat("--env-file ", path, " line ", number, ": expected KEY=VALUE"));
    }
    (*spec->mutable_env())[std::string(text.substr(0, eq))] = std::string(text.substr(eq + 1));
  }
}

}  // namespace

const char kJobOptionsHelp[] = R"(job options:
  --np N                          number of ranks (required unless --min-np or --max-np)
  --min-np N, --max-np N          elastic: run with as many ranks as free workers allow in
                                  [N, M], growing when workers come free; a lost rank starts a
                                  new epoch with the others instead of failing the job (scripts
                                  use hvd.elastic). Defaults: the other bound, or --np
  --reset-limit N                 elastic: fail after N new epochs (default 0: no limit)
  --elastic-timeout S             elastic: fail after S seconds below --min-np (default 600)
  --processes-per-host K          at most K ranks per host (default: no limit)
  --max-run S                     time limit: a job still running S seconds after its ranks were
                                  assigned is stopped and FAILED (SageMaker's max_run; default 0:
                                  none; at most 30 days)
  --name NAME                     job name (default: the command's base name)
  --env KEY=VALUE                 environment for the training processes (repeatable; wins over
                                  what is inherited)
  --env-file FILE                 KEY=VALUE lines for the environment (Docker's format; '#'
                                  comments): secrets stay out of the command line. Values are
                                  redacted in every reply and never logged
  --working-dir DIR               working directory of the training processes (default: the
                                  current directory)
  --label KEY=VALUE               job label (repeatable)
  --fusion-threshold-mb MB        fusion buffer size in MiB (default 128; 0 disables fusion)
  --fusion-threshold-bytes B      the same in bytes
  --cycle-time-ms MS              negotiation cycle time (default 1)
  --cache-capacity N              response cache entries (default 1024; 0 disables)
  --autotune                      tune fusion threshold, cycle time and response cache on/off
                                  (Bayesian optimisation); knobs given by a flag or environment
                                  variable stay fixed
  --autotune-start-from-given     tune the given knobs too, starting from the given values
  --autotune-log-file FILE        autotune CSV log (a job artifact)
  --autotune-warmup-samples N     (default 3)
  --autotune-steps-per-sample N   (default 10)
  --autotune-bayes-opt-max-samples N  (default 20)
  --autotune-gaussian-process-noise X (default 0.8)
  --timeline FILE                 Chrome-trace timeline (a job artifact)
  --timeline-mark-cycles          mark negotiation cycles in the timeline
  --stall-check-seconds S         report stalled tensors after S seconds (default 60; 0 disables)
  --no-stall-check                the same as --stall-check-seconds 0
  --stall-shutdown-seconds S      fail the job when a stall lasts S seconds (default 0: never)
  --straggler-action none|warn|fail|evict  when a rank is named as holding the job back: nothing
                                  but status, metrics and timeline (none, the default), a job event
                                  (warn), the job fails naming it (fail), or an elastic job drops
                                  it and goes on without its host for a cool-down (evict)
  --straggler-cooldown-seconds S  how long evict keeps the host out of the job (default 300)
  --backend auto|gloo|nccl        collective backend (default auto)
  --no-shm-allreduce              CPU allreduce among one host's ranks over sockets, not shared
                                  memory (default: shared memory)
  --no-local-negotiation          a one-host CPU job negotiates every collective through the
                                  coordinator, not a lone cached allreduce among its daemons through
                                  shared memory (default: locally; RINGMASTER_LOCAL_NEGOTIATION)
  --no-hierarchical-allreduce     CPU allreduce of a job spread over hosts flat over Gloo, not within
                                  each host through shared memory, then across hosts (default:
                                  hierarchical when every host runs as many ranks, two or more)
  --no-hierarchical-allgather     CPU allgather of such a job flat over Gloo, not across hosts among
                                  the ranks of each local index, then within each host through
                                  shared memory (default: hierarchical, on the same condition)
  --negotiation-relay             each host's ranks negotiate through one of its daemons: one message
                                  per host and cycle to the coordinator, for jobs of hundreds of
                                  ranks (default off; RINGMASTER_NEGOTIATION_RELAY=1)
  --negotiation-relay-hosts N     the negotiation relay (implies --negotiation-relay) with one relay
                                  for every N hosts (their ranks reach it over TCP): one message
                                  per N hosts and cycle (default 1: a relay per host;
                                  RINGMASTER_NEGOTIATION_RELAY_HOSTS)
Knobs also read Horovod's environment variables (HOROVOD_FUSION_THRESHOLD, HOROVOD_CYCLE_TIME, ...),
and the elastic options HOROVOD_MIN_NP, HOROVOD_MAX_NP, HOROVOD_RESET_LIMIT and
HOROVOD_ELASTIC_TIMEOUT (RINGMASTER_* alike); flags win over the environment.
)";

std::string ExecutableDir() {
  std::error_code error;
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", error);
  return error ? "." : exe.parent_path().string();
}

bool Inherited(const std::string& key) {
  if (key == "RINGMASTER_COORDINATOR" || key == "RINGMASTER_TOKEN") return false;
  return key == "PATH" || key == "PYTHONPATH" || key == "HOME" || key == "LANG" ||
         key == "LC_ALL" || absl::StartsWith(key, "HOROVOD_") ||
         absl::StartsWith(key, "RINGMASTER_") || absl::StartsWith(key, "NCCL_") ||
         absl::StartsWith(key, "MXNET_");
}

void InheritCallerEnvironment(const std::string& bin_dir, v1::JobSpec* spec) {
  auto& env = *spec->mutable_env();
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const size_t eq = entry.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    const std::string key = entry.substr(0, eq);
    if (Inherited(key) && !env.contains(key)) env[key] = entry.substr(eq + 1);
  }
  std::error_code error;
  const std::filesystem::path python =
      std::filesystem::weakly_canonical(std::filesystem::path(bin_dir) / ".." / "python", error);
  if (!error && std::filesystem::is_directory(python, error)) {
    const std::string old = env.contains("PYTHONPATH") ? env.at("PYTHONPATH") : "";
    env["PYTHONPATH"] = old.empty() ? python.string() : absl::StrCat(python.string(), ":", old);
  }
  // The build's bin/ first on PATH, so the job finds this build's tools (ringmaster-bench, ...).
  const std::string path = env.contains("PATH") ? env.at("PATH") : "";
  bool listed = false;
  for (absl::string_view entry : absl::StrSplit(path, ':')) listed |= entry == bin_dir;
  if (!listed) env["PATH"] = path.empty() ? bin_dir : absl::StrCat(bin_dir, ":", path);
}

v1::JobSpec ParseJobSpec(const std::string& command, Args& args, const ExtraFlag& extra,
                         std::map<std::string, std::string>* requested_paths) {
  v1::JobSpec spec;
  Knobs knobs;
  if (absl::Status s = ApplyEnvironment(ProcessEnv(), &knobs); !s.ok()) {
    Usage(std::string(s.message()));
  }
  bool have_np = false;
  // Elastic options: the environment first (RINGMASTER_ wins over HOROVOD_), then the flags.
  for (const auto& [suffix, field] :
       std::vector<std::pair<const char*, void (v1::JobSpec::*)(int32_t)>>{
           {"MIN_NP", &v1::JobSpec::set_min_np},
           {"MAX_NP", &v1::JobSpec::set_max_np},
           {"RESET_LIMIT", &v1::JobSpec::set_reset_limit},
           {"ELASTIC_TIMEOUT", &v1::JobSpec::set_elastic_timeout_seconds}}) {
    for (const char* prefix : {"HOROVOD_", "RINGMASTER_"}) {
      const std::string name = absl::StrCat(prefix, suffix);
      if (std::optional<std::string> value = ProcessEnv()(name); value.has_value()) {
        (spec.*field)(Number<int32_t>(name, *value));
      }
    }
  }
  // Knobs given by a flag or the environment: fixed under autotune (unless started from).
  bool given_fusion = false, given_cycle = false, given_cache = false, start_from_given = false;
  const EnvLookup env = ProcessEnv();
  for (const char* prefix : {"HOROVOD_", "RINGMASTER_"}) {
    given_fusion |= env(absl::StrCat(prefix, "FUSION_THRESHOLD")).has_value();
    given_cycle |= env(absl::StrCat(prefix, "CYCLE_TIME")).has_value();
    given_cache |= env(absl::StrCat(prefix, "CACHE_CAPACITY")).has_value();
  }
  while (!args.Done()) {
    std::string flag = args.Next();
    if (flag == "--") break;
    if (flag == "--np") {
      spec.set_np(Number<int32_t>(flag, args.Value(flag)));
      have_np = true;
    } else if (flag == "--min-np") {
      spec.set_min_np(Number<int32_t>(flag, args.Value(flag)));
    } else if (flag == "--max-np") {
      spec.set_max_np(Number<int32_t>(flag, args.Value(flag)));
    } else if (flag == "--reset-limit") {
      spec.set_reset_limit(Number<int32_t>(flag, args.Value(flag)));
    } else if (flag == "--elastic-timeout") {
      spec.set_elastic_timeout_seconds(Number<int32_t>(flag, args.Value(flag)));
    } else if (flag == "--max-run") {
      spec.set_max_run_seconds(Number<int32_t>(flag, args.Value(flag)));
    } else if (flag == "--processes-per-host") {
      spec.set_processes_per_host(Number<int32_t>(flag, args.Value(flag)));
    } else if (flag == "--name") {
      spec.set_name(args.Value(flag));
    } else if (flag == "--env") {
      auto [k, v] = KeyValue(flag, args.Value(flag));
      (*spec.mutable_env())[k] = v;
    } else if (flag == "--env-file") {
      ReadEnvFile(args.Value(flag), &spec);
    } else if (flag == "--label") {
      auto [k, v] = KeyValue(flag, args.Value(flag));
      (*spec.mutable_labels())[k] = v;
    } else if (flag == "--working-dir") {
      spec.set_working_dir(args.Value(flag));
    } else if (flag == "--fusion-threshold-mb") {
      knobs.fusion_threshold_bytes =
          static_cast<int64_t>(Number<double>(flag, args.Value(flag)) * (1 << 20));
      given_fusion = true;
    } else if (flag == "--fusion-threshold-bytes") {
      knobs.fusion_threshold_bytes = Number<int64_t>(flag, args.Value(flag));
      given_fusion = true;
    } else if (flag == "--cycle-time-ms") {
      knobs.cycle_time_ms = Number<double>(flag, args.Value(flag));
      given_cycle = true;
    } else if (flag == "--cache-capacity") {
      knobs.cache_capacity = Number<int32_t>(flag, args.Value(flag));
      given_cache = true;
    } else if (flag == "--autotune") {
      knobs.autotune = true;
    } else if (flag == "--autotune-start-from-given") {
      start_from_given = true;
    } else if (flag == "--autotune-log-file") {
      knobs.autotune_log = args.Value(flag);
    } else if (flag == "--autotune-warmup-samples") {
      knobs.autotune_warmup_samples = Number<int32_t>(flag, args.Value(flag));
    } else if (flag == "--autotune-steps-per-sample") {
      knobs.autotune_steps_per_sample = Number<int32_t>(flag, args.Value(flag));
    } else if (flag == "--autotune-bayes-opt-max-samples") {
      knobs.autotune_bayes_opt_max_samples = Number<int32_t>(flag, args.Value(flag));
    } else if (flag == "--autotune-gaussian-process-noise") {
      knobs.autotune_gaussian_process_noise = Number<double>(flag, args.Value(flag));
    } else if (flag == "--timeline" || flag == "--timeline-filename") {
      knobs.timeline = args.Value(flag);
    } else if (flag == "--timeline-mark-cycles") {
      knobs.timeline_mark_cycles = true;
    } else if (flag == "--stall-check-seconds") {
      knobs.stall_check_seconds = Number<double>(flag, args.Value(flag));
    } else if (flag == "--no-shm-allreduce") {
      knobs.shm_allreduce = false;
    } else if (flag == "--shm-allreduce") {
      knobs.shm_allreduce = true;
    } else if (flag == "--no-local-negotiation") {
      knobs.local_negotiation = false;
    } else if (flag == "--local-negotiation") {
      knobs.local_negotiation = true;
    } else if (flag == "--no-hierarchical-allreduce") {
      knobs.hierarchical_allreduce = false;
    } else if (flag == "--hierarchical-allreduce") {
      knobs.hierarchical_allreduce = true;
    } else if (flag == "--no-hierarchical-allgather") {
      knobs.hierarchical_allgather = false;
    } else if (flag == "--hierarchical-allgather") {
      knobs.hierarchical_allgather = true;
    } else if (flag == "--negotiation-relay") {
      knobs.negotiation_relay = true;
    } else if (flag == "--no-negotiation-relay") {
      knobs.negotiation_relay = false;
    } else if (flag == "--negotiation-relay-hosts") {
      knobs.negotiation_relay_hosts = Number<int32_t>(flag, args.Value(flag));
      knobs.negotiation_relay = true;  // asking for relay groups asks for the relay
    } else if (flag == "--no-stall-check") {
      knobs.stall_check_seconds = 0;
    } else if (flag == "--straggler-action") {
      knobs.straggler_action = args.Value(flag);
    } else if (flag == "--straggler-cooldown-seconds") {
      knobs.straggler_cooldown_seconds = Number<double>(flag, args.Value(flag));
    } else if (flag == "--stall-shutdown-seconds") {
      knobs.stall_shutdown_seconds = Number<double>(flag, args.Value(flag));
    } else if (flag == "--backend") {
      std::string b = args.Value(flag);
      if (b == "auto") {
        knobs.backend = Backend::kAuto;
      } else if (b == "gloo") {
        knobs.backend = Backend::kGloo;
      } else if (b == "nccl") {
        knobs.backend = Backend::kNccl;
      } else {
        Usage(absl::StrCat("--backend '", b, "' is not auto, gloo or nccl"));
      }
    } else if (!extra || !extra(flag, args)) {
      if (!absl::StartsWith(flag, "-")) {
        // The command itself, without the "--" that separates it from the options.
        Usage(absl::StrCat(
            command, ": '", flag, "' is not an option; put -- before the command: ", "ringmaster ",
            command, " [options] -- ", flag, args.Done() ? "" : " ", args.Remaining()));
      }
      Usage(absl::StrCat(command, ": unknown option '", flag, "' (ringmaster ", command,
                         " --help lists them)"));
    }
  }
  if (!have_np && spec.min_np() == 0 && spec.max_np() == 0) {
    Usage(absl::StrCat(command, " needs --np N (or --min-np/--max-np for an elastic job)"));
  }
  for (const std::string& arg : args.Rest()) spec.add_command(arg);
  if (spec.name().empty()) {
    std::string base = spec.command().empty() ? "job" : spec.command(0);
    base = base.substr(base.find_last_of('/') + 1);
    std::string name;
    for (char c : base) {
      name += absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-' ? c : '-';
    }
    spec.set_name(name.empty() ? "job" : name.substr(0, 128));
  }
  v1::Knobs* k = spec.mutable_knobs();
  k->set_fusion_threshold_bytes(knobs.fusion_threshold_bytes);
  k->set_cycle_time_ms(knobs.cycle_time_ms);
  k->set_cache_capacity(knobs.cache_capacity);
  k->set_autotune(knobs.autotune);
  k->set_autotune_warmup_samples(knobs.autotune_warmup_samples);
  k->set_autotune_steps_per_sample(knobs.autotune_steps_per_sample);
  k->set_autotune_bayes_opt_max_samples(knobs.autotune_bayes_opt_max_samples);
  k->set_autotune_gaussian_process_noise(knobs.autotune_gaussian_process_noise);
  k->set_autotune_log(ArtifactName(knobs.autotune_log, requested_paths));
  k->set_timeline(ArtifactName(knobs.timeline, requested_paths));
  k->set_timeline_mark_cycles(knobs.timeline_mark_cycles);
  k->set_stall_check_seconds(knobs.stall_check_seconds);
  k->set_stall_shutdown_seconds(knobs.stall_shutdown_seconds);
  k->set_backend(static_cast<v1::Backend>(knobs.backend));
  k->set_shm_allreduce(knobs.shm_allreduce);
  k->set_local_negotiation(knobs.local_negotiation);
  k->set_hierarchical_allreduce(knobs.hierarchical_allreduce);
  k->set_hierarchical_allgather(knobs.hierarchical_allgather);
  k->set_negotiation_relay(knobs.negotiation_relay);
  k->set_negotiation_relay_hosts(knobs.negotiation_relay_hosts);
  k->set_straggler_action(knobs.straggler_action);
  k->set_straggler_cooldown_seconds(knobs.straggler_cooldown_seconds);
  if (!start_from_given) {
    if (given_fusion) k->add_autotune_fixed("fusion_threshold_bytes");
    if (given_cycle) k->add_autotune_fixed("cycle_time_ms");
    if (given_cache) k->add_autotune_fixed("cache_capacity");
  }
  return spec;
}

}  // namespace ringmaster::cli
