#include "coordinator/job.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace ringmaster {
namespace {

bool IsNameChar(char c) { return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-'; }

absl::Status ValidateMap(const std::map<std::string, std::string>& m, absl::string_view field,
                         size_t max_entries, size_t max_key, size_t max_value) {
  if (m.size() > max_entries) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.", field, " has ", m.size(), " entries; at most ", max_entries));
  }
  for (const auto& [k, v] : m) {
    if (k.empty() || k.size() > max_key) {
      return absl::InvalidArgumentError(absl::StrCat("spec.", field, " key '", k.substr(0, 64),
                                                     "' must be 1..", max_key, " bytes"));
    }
    if (v.size() > max_value) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.", field, "['", k, "'] is longer than ", max_value, " bytes"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool IsTerminal(JobState state) {
  return state == JobState::kSucceeded || state == JobState::kFailed ||
         state == JobState::kCancelled;
}

absl::string_view JobStateName(JobState state) {
  switch (state) {
    case JobState::kPending:
      return "PENDING";
    case JobState::kStarting:
      return "STARTING";
    case JobState::kRunning:
      return "RUNNING";
    case JobState::kSucceeded:
      return "SUCCEEDED";
    case JobState::kFailed:
      return "FAILED";
    case JobState::kCancelled:
      return "CANCELLED";
  }
  return "UNSPECIFIED";
}

absl::Status ValidateJobSpec(const JobSpec& spec) {
  if (spec.name.empty() || spec.name.size() > 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.name must be 1..128 bytes; got ", spec.name.size()));
  }
  for (char c : spec.name) {
    if (!IsNameChar(c)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "spec.name '", spec.name, "' may contain only letters, digits, '.', '_' and '-'"));
    }
  }
  if (spec.np < 1 || spec.np > kMaxNp) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.np = ", spec.np, " is out of bounds [1, ", kMaxNp, "]"));
  }
  if (spec.elastic()) {
    if (spec.min_np < 1 || spec.min_np > spec.np) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.min_np = ", spec.min_np, " is out of bounds [1, np = ", spec.np, "]"));
    }
    if (spec.max_np < spec.np || spec.max_np > kMaxNp) {
      return absl::InvalidArgumentError(absl::StrCat(
          "spec.max_np = ", spec.max_np, " is out of bounds [np = ", spec.np, ", ", kMaxNp, "]"));
    }
    if (spec.reset_limit < 0 || spec.reset_limit > 1'000'000) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.reset_limit = ", spec.reset_limit, " is out of bounds [0, 1000000]"));
    }
    if (spec.elastic_timeout_seconds < 0 || spec.elastic_timeout_seconds > 86400) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.elastic_timeout_seconds = ", spec.elastic_timeout_seconds,
                       " is out of bounds [0, 86400]"));
    }
    if (spec.attached) {
      return absl::InvalidArgumentError(
          "spec.min_np/max_np: an attached job (spec.attached) cannot be elastic: its ranks are "
          "the processes that claim them");
    }
  } else if (spec.reset_limit != 0 || spec.elastic_timeout_seconds != 0) {
    return absl::InvalidArgumentError(
        "spec.reset_limit and spec.elastic_timeout_seconds need an elastic job (spec.min_np or "
        "spec.max_np)");
  } else if (spec.knobs.straggler_action == "evict") {
    return absl::InvalidArgumentError(
        "knobs.straggler_action = 'evict' needs an elastic job (spec.min_np or spec.max_np): a "
        "job of a fixed size cannot drop a rank (use warn or fail)");
  }
  if (spec.max_run_seconds < 0 || spec.max_run_seconds > kMaxRunSeconds) {
    return absl::InvalidArgumentError(absl::StrCat("spec.max_run_seconds = ", spec.max_run_seconds,
                                                   " is out of bounds [0, ", kMaxRunSeconds, "]"));
  }
  const int32_t most = spec.elastic() ? spec.max_np : spec.np;
  if (spec.processes_per_host < 0 || spec.processes_per_host > most) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.processes_per_host = ", spec.processes_per_host,
                     " is out of bounds [0, ", spec.elastic() ? "max_np" : "np", " = ", most, "]"));
  }
  if (spec.command.size() > 1024) {
    return absl::InvalidArgumentError("spec.command has more than 1024 arguments");
  }
  for (size_t i = 0; i < spec.command.size(); ++i) {
    if (spec.command[i].size() > 65536) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.command[", i, "] is longer than 65536 bytes"));
    }
  }
  if (!spec.command.empty() && spec.command[0].empty()) {
    return absl::InvalidArgumentError("spec.command[0] (the program) is empty");
  }
  if (absl::Status s = ValidateMap(spec.env, "env", 1024, 256, 65536); !s.ok()) return s;
  for (const auto& [k, v] : spec.env) {
    bool ok = !absl::ascii_isdigit(k[0]);
    for (char c : k) ok = ok && (absl::ascii_isalnum(c) || c == '_');
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.env key '", k, "' is not a variable name ([A-Za-z_][A-Za-z0-9_]*)"));
    }
  }
  if (spec.working_dir.size() > 4096) {
    return absl::InvalidArgumentError("spec.working_dir is longer than 4096 bytes");
  }
  if (absl::Status s = ValidateMap(spec.labels, "labels", 64, 63, 256); !s.ok()) return s;
  if (!spec.source.sha256.empty()) {
    if (spec.command.empty()) {
      return absl::InvalidArgumentError(
          "spec.command is empty but the job has a source archive: name the entry point to run "
          "in the unpacked code");
    }
    if (!spec.working_dir.empty()) {
      return absl::InvalidArgumentError(
          "spec.working_dir must be empty for a job with a source archive: its ranks run in the "
          "unpacked code");
    }
  }
  if (spec.attached) {
    if (!spec.command.empty()) {
      return absl::InvalidArgumentError(
          "spec.command must be empty for an attached job (spec.attached): its ranks are the "
          "training processes that attach and claim them, not processes the workers start");
    }
    if (!spec.source.sha256.empty()) {
      return absl::InvalidArgumentError(
          "spec.source must be empty for an attached job (spec.attached): its processes bring "
          "their own code");
    }
  }
  if (spec.request_id.size() > 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.request_id must be at most 128 bytes; got ", spec.request_id.size()));
  }
  // Each field has its bound; together they are bounded too, so that the jobs the coordinator
  // holds (--max-active-jobs of them) have a bounded size.
  size_t bytes = spec.name.size() + spec.working_dir.size();
  for (const std::string& arg : spec.command) bytes += arg.size();
  for (const auto& [k, v] : spec.env) bytes += k.size() + v.size();
  for (const auto& [k, v] : spec.labels) bytes += k.size() + v.size();
  if (bytes > kMaxSpecBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec holds ", bytes,
                     " bytes of command, env, labels, name and working_dir; at "
                     "most ",
                     kMaxSpecBytes));
  }
  if (absl::Status s = ValidateKnobs(spec.knobs); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("spec.", s.message()));
  }
  return absl::OkStatus();
}

void FillElasticDefaults(JobSpec& spec) {
  if (!spec.elastic()) return;
  if (spec.np <= 0) spec.np = spec.max_np > 0 ? spec.max_np : spec.min_np;
  if (spec.min_np <= 0) spec.min_np = spec.np;
  if (spec.max_np <= 0) spec.max_np = spec.np;
}

std::string Placement(const RankInfo& r) {
  return absl::StrCat("rank ", r.rank, " on host ", r.host, " (", r.worker_id, ")");
}

}  // namespace ringmaster
