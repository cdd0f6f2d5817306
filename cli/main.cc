// ringmaster: the command-line client of the coordinator.
//
//   ringmaster [--coordinator ADDR:PORT] [--json] [--timeout-seconds S] COMMAND [ARGS]
//     submit --np N [--processes-per-host K] [--name NAME] [--env K=V]... [knobs] -- CMD ARGS...
//     jobs [--state STATE]...
//     status JOB
//     cancel JOB [--reason TEXT]
//     watch JOB
//
// The coordinator address comes from --coordinator, else $RINGMASTER_COORDINATOR, else
// localhost:50051. Exit status: 0 on success, 1 when the call fails (one line on stderr), 2 for a usage
// error; `watch` exits 0 when the job SUCCEEDED and 1 when it FAILED or was CANCELLED.
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/knobs.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "ringmaster/v1/job.grpc.pb.h"

namespace ringmaster::cli {
namespace {

namespace v1 = ringmaster::v1;

constexpr char kUsage[] = R"(usage: ringmaster [--coordinator ADDR:PORT] [--json] [--timeout-seconds S] COMMAND [ARGS]

commands:
  submit --np N [options] -- CMD [ARGS...]   register a job; prints it (with its id)
  jobs [--state STATE]...                    list jobs, newest first
  status JOB                                 a job's state, ranks, knobs and events
  cancel JOB [--reason TEXT]                 cancel a job
  watch JOB                                  stream a job's events until it ends

submit options:
  --np N                          number of ranks (required)
  --processes-per-host K          at most K ranks per host (default: no limit)
  --name NAME                     job name (default: the command's base name)
  --env KEY=VALUE                 environment for the training processes (repeatable)
  --working-dir DIR               working directory of the training processes
  --label KEY=VALUE               job label (repeatable)
  --fusion-threshold-mb MB        fusion buffer size in MiB (default 128; 0 disables fusion)
  --fusion-threshold-bytes B      the same in bytes
  --cycle-time-ms MS              negotiation cycle time (default 1)
  --cache-capacity N              response cache entries (default 1024; 0 disables)
  --autotune                      tune fusion threshold and cycle time (Bayesian optimisation)
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
  --backend auto|gloo|nccl        collective backend (default auto)
Knobs also read Horovod's environment variables (HOROVOD_FUSION_THRESHOLD, HOROVOD_CYCLE_TIME, ...);
flags win over the environment.
)";

[[noreturn]] void Usage(const std::string& message) {
  std::fprintf(stderr, "ringmaster: %s\n(run 'ringmaster --help' for usage)\n", message.c_str());
  std::exit(2);
}

[[noreturn]] void Fail(const grpc::Status& status) {
  static const char* const kCodes[] = {
      "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
      "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
      "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
  const int code = status.error_code();
  std::fprintf(stderr, "ringmaster: %s: %s\n", code >= 0 && code <= 16 ? kCodes[code] : "ERROR",
               status.error_message().c_str());
  std::exit(1);
}

// Walks argv, handing out options and their values.
class Args {
 public:
  Args(int argc, char** argv) : args_(argv + 1, argv + argc) {}
  // Removes `flag` wherever it stands before "--"; returns whether it was there.
  bool Extract(const std::string& flag) {
    bool found = false;
    for (size_t i = pos_; i < args_.size() && args_[i] != "--";) {
      if (args_[i] == flag) {
        args_.erase(args_.begin() + i);
        found = true;
      } else {
        ++i;
      }
    }
    return found;
  }
  bool Done() const { return pos_ >= args_.size(); }
  const std::string& Peek() const { return args_[pos_]; }
  std::string Next() { return args_[pos_++]; }
  std::string Value(const std::string& flag) {
    if (Done()) Usage(absl::StrCat(flag, " needs a value"));
    return Next();
  }
  std::vector<std::string> Rest() {
    std::vector<std::string> rest(args_.begin() + pos_, args_.end());
    pos_ = args_.size();
    return rest;
  }

 private:
  std::vector<std::string> args_;
  size_t pos_ = 0;
};

template <typename T>
T Number(const std::string& flag, const std::string& text) {
  T value;
  bool ok;
  if constexpr (std::is_floating_point_v<T>) {
    ok = absl::SimpleAtod(text, &value);
  } else {
    ok = absl::SimpleAtoi(text, &value);
  }
  if (!ok) Usage(absl::StrCat(flag, " '", text, "' is not a number"));
  return value;
}

std::pair<std::string, std::string> KeyValue(const std::string& flag, const std::string& text) {
  size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0) Usage(absl::StrCat(flag, " '", text, "' is not KEY=VALUE"));
  return {text.substr(0, eq), text.substr(eq + 1)};
}

std::string Json(const google::protobuf::Message& message) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
}

std::string StateName(v1::JobState state) {
  std::string name = v1::JobState_Name(state);
  return absl::StartsWith(name, "JOB_STATE_") ? name.substr(10) : name;
}

std::string RankStateName(v1::RankState state) {
  std::string name = v1::RankState_Name(state);
  return absl::StartsWith(name, "RANK_STATE_") ? name.substr(11) : name;
}

std::string TimeString(int64_t unix_ms) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::FromUnixMillis(unix_ms), absl::UTCTimeZone());
}

std::string Age(int64_t unix_ms) {
  absl::Duration d = absl::Now() - absl::FromUnixMillis(unix_ms);
  if (d < absl::Minutes(1)) return absl::StrCat(absl::ToInt64Seconds(d), "s");
  if (d < absl::Hours(1)) return absl::StrCat(absl::ToInt64Minutes(d), "m");
  if (d < absl::Hours(48)) return absl::StrCat(absl::ToInt64Hours(d), "h");
  return absl::StrCat(absl::ToInt64Hours(d) / 24, "d");
}

// Prints rows as aligned columns.
void PrintTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    width.resize(std::max(width.size(), row.size()));
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(width[i] - row[i].size() + 2, ' ');
    }
    std::printf("%s\n", line.c_str());
  }
}

void PrintJob(const v1::Job& job) {
  const v1::JobSpec& s = job.spec();
  std::printf("Job:       %s\n", job.id().c_str());
  std::printf("Name:      %s\n", s.name().c_str());
  std::printf("State:     %s\n", StateName(job.state()).c_str());
  if (!job.reason().empty()) std::printf("Reason:    %s\n", job.reason().c_str());
  std::printf("Ranks:     %d (%s)\n", s.np(),
              s.processes_per_host() > 0
                  ? absl::StrCat("at most ", s.processes_per_host(), " per host").c_str()
                  : "no per-host limit");
  std::printf("Epoch:     %lld\n", static_cast<long long>(job.epoch()));
  std::printf("Created:   %s\n", TimeString(job.create_time_unix_ms()).c_str());
  std::printf("Command:   %s\n",
              s.command().empty() ? "(processes attach to their workers)"
                                  : absl::StrJoin(s.command(), " ").c_str());
  const v1::Knobs& k = s.knobs();
  std::printf(
      "Knobs:     fusion_threshold=%lld bytes, cycle_time=%g ms, cache_capacity=%d, autotune=%s, "
      "timeline=%s, stall_check=%g s, stall_shutdown=%g s, backend=%s\n",
      static_cast<long long>(k.fusion_threshold_bytes()), k.cycle_time_ms(), k.cache_capacity(),
      k.autotune() ? "on" : "off", k.timeline().empty() ? "off" : k.timeline().c_str(),
      k.stall_check_seconds(), k.stall_shutdown_seconds(),
      absl::AsciiStrToLower(v1::Backend_Name(k.backend()).substr(8)).c_str());
  if (job.ranks_size() > 0) {
    std::printf("\n");
    std::vector<std::vector<std::string>> rows = {
        {"RANK", "HOST", "DEVICE", "WORKER", "LOCAL", "CROSS", "STATE", "EXIT"}};
    for (const v1::RankInfo& r : job.ranks()) {
      rows.push_back({absl::StrCat(r.rank()), r.host(), r.device(), r.worker_id(),
                      absl::StrCat(r.local_rank(), "/", r.local_size()),
                      absl::StrCat(r.cross_rank(), "/", r.cross_size()), RankStateName(r.state()),
                      r.state() == v1::RANK_STATE_EXITED ? absl::StrCat(r.exit_code()) : "-"});
    }
    PrintTable(rows);
  }
  std::printf("\nEvents:\n");
  for (const v1::JobEvent& e : job.events()) {
    std::printf("  %s  %-9s  %s\n", TimeString(e.time_unix_ms()).c_str(),
                StateName(e.state()).c_str(), e.message().c_str());
  }
}

struct Global {
  std::string coordinator;
  bool json = false;
  double timeout_seconds = 10;
};

std::unique_ptr<grpc::ClientContext> Context(const Global& g) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(g.timeout_seconds * 1000)));
  return context;
}

int Submit(const Global& g, v1::JobService::Stub& stub, Args& args) {
  v1::JobSpec spec;
  Knobs knobs;
  if (absl::Status s = ApplyEnvironment(ProcessEnv(), &knobs); !s.ok()) {
    Usage(std::string(s.message()));
  }
  bool have_np = false;
  while (!args.Done()) {
    std::string flag = args.Next();
    if (flag == "--") break;
    if (flag == "--np") {
      spec.set_np(Number<int32_t>(flag, args.Value(flag)));
      have_np = true;
    } else if (flag == "--processes-per-host") {
      spec.set_processes_per_host(Number<int32_t>(flag, args.Value(flag)));
    } else if (flag == "--name") {
      spec.set_name(args.Value(flag));
    } else if (flag == "--env") {
      auto [k, v] = KeyValue(flag, args.Value(flag));
      (*spec.mutable_env())[k] = v;
    } else if (flag == "--label") {
      auto [k, v] = KeyValue(flag, args.Value(flag));
      (*spec.mutable_labels())[k] = v;
    } else if (flag == "--working-dir") {
      spec.set_working_dir(args.Value(flag));
    } else if (flag == "--fusion-threshold-mb") {
      knobs.fusion_threshold_bytes =
          static_cast<int64_t>(Number<double>(flag, args.Value(flag)) * (1 << 20));
    } else if (flag == "--fusion-threshold-bytes") {
      knobs.fusion_threshold_bytes = Number<int64_t>(flag, args.Value(flag));
    } else if (flag == "--cycle-time-ms") {
      knobs.cycle_time_ms = Number<double>(flag, args.Value(flag));
    } else if (flag == "--cache-capacity") {
      knobs.cache_capacity = Number<int32_t>(flag, args.Value(flag));
    } else if (flag == "--autotune") {
      knobs.autotune = true;
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
    } else if (flag == "--no-stall-check") {
      knobs.stall_check_seconds = 0;
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
    } else {
      Usage(absl::StrCat("submit: unknown option '", flag, "'"));
    }
  }
  if (!have_np) Usage("submit needs --np N");
  for (const std::string& arg : args.Rest()) spec.add_command(arg);
  if (spec.name().empty()) {
    std::string base = spec.command().empty() ? "job" : spec.command(0);
    base = base.substr(base.find_last_of('/') + 1);
    std::string name;
    for (char c : base) name += absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-' ? c : '-';
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
  k->set_autotune_log(knobs.autotune_log);
  k->set_timeline(knobs.timeline);
  k->set_timeline_mark_cycles(knobs.timeline_mark_cycles);
  k->set_stall_check_seconds(knobs.stall_check_seconds);
  k->set_stall_shutdown_seconds(knobs.stall_shutdown_seconds);
  k->set_backend(static_cast<v1::Backend>(knobs.backend));

  v1::RegisterJobRequest request;
  *request.mutable_spec() = spec;
  v1::RegisterJobResponse response;
  grpc::Status status = stub.RegisterJob(Context(g).get(), request, &response);
  if (!status.ok()) Fail(status);
  if (g.json) {
    std::printf("%s\n", Json(response.job()).c_str());
  } else {
    std::printf("%s  %s  %s\n", response.job().id().c_str(), response.job().spec().name().c_str(),
                StateName(response.job().state()).c_str());
  }
  return 0;
}

int Jobs(const Global& g, v1::JobService::Stub& stub, Args& args) {
  v1::ListJobsRequest request;
  while (!args.Done()) {
    std::string flag = args.Next();
    if (flag != "--state") Usage(absl::StrCat("jobs: unknown option '", flag, "'"));
    std::string name = absl::AsciiStrToUpper(args.Value(flag));
    v1::JobState state;
    if (!v1::JobState_Parse(absl::StrCat("JOB_STATE_", name), &state) ||
        state == v1::JOB_STATE_UNSPECIFIED) {
      Usage(absl::StrCat("--state '", name,
                         "' is not PENDING, STARTING, RUNNING, SUCCEEDED, FAILED or CANCELLED"));
    }
    request.add_states(state);
  }
  v1::ListJobsResponse response;
  grpc::Status status = stub.ListJobs(Context(g).get(), request, &response);
  if (!status.ok()) Fail(status);
  if (g.json) {
    std::printf("%s\n", Json(response).c_str());
    return 0;
  }
  std::vector<std::vector<std::string>> rows = {{"JOB", "NAME", "STATE", "NP", "AGE", "REASON"}};
  for (const v1::Job& job : response.jobs()) {
    rows.push_back({job.id(), job.spec().name(), StateName(job.state()),
                    absl::StrCat(job.spec().np()), Age(job.create_time_unix_ms()), job.reason()});
  }
  PrintTable(rows);
  return 0;
}

std::string JobArg(Args& args, const char* command) {
  if (args.Done() || absl::StartsWith(args.Peek(), "--")) Usage(absl::StrCat(command, " needs JOB"));
  return args.Next();
}

int Status(const Global& g, v1::JobService::Stub& stub, Args& args) {
  v1::GetJobRequest request;
  request.set_job_id(JobArg(args, "status"));
  if (!args.Done()) Usage(absl::StrCat("status: unexpected '", args.Peek(), "'"));
  v1::GetJobResponse response;
  grpc::Status status = stub.GetJob(Context(g).get(), request, &response);
  if (!status.ok()) Fail(status);
  if (g.json) {
    std::printf("%s\n", Json(response.job()).c_str());
  } else {
    PrintJob(response.job());
  }
  return 0;
}

int Cancel(const Global& g, v1::JobService::Stub& stub, Args& args) {
  v1::CancelJobRequest request;
  request.set_job_id(JobArg(args, "cancel"));
  while (!args.Done()) {
    std::string flag = args.Next();
    if (flag != "--reason") Usage(absl::StrCat("cancel: unknown option '", flag, "'"));
    request.set_reason(args.Value(flag));
  }
  v1::CancelJobResponse response;
  grpc::Status status = stub.CancelJob(Context(g).get(), request, &response);
  if (!status.ok()) Fail(status);
  if (g.json) {
    std::printf("%s\n", Json(response.job()).c_str());
  } else {
    std::printf("%s  %s  %s\n", response.job().id().c_str(),
                StateName(response.job().state()).c_str(), response.job().reason().c_str());
  }
  return 0;
}

int Watch(const Global& g, v1::JobService::Stub& stub, Args& args) {
  v1::WatchJobRequest request;
  request.set_job_id(JobArg(args, "watch"));
  if (!args.Done()) Usage(absl::StrCat("watch: unexpected '", args.Peek(), "'"));
  grpc::ClientContext context;  // no deadline: a watch lasts as long as the job
  auto reader = stub.WatchJob(&context, request);
  v1::WatchJobResponse message;
  v1::JobState last = v1::JOB_STATE_UNSPECIFIED;
  bool first = true;
  while (reader->Read(&message)) {
    last = message.job().state();
    if (g.json) {
      std::printf("%s\n", Json(message).c_str());
    } else if (first) {
      // Replay what happened before the watch started.
      for (const v1::JobEvent& e : message.job().events()) {
        std::printf("%s  %-9s  %s\n", TimeString(e.time_unix_ms()).c_str(),
                    StateName(e.state()).c_str(), e.message().c_str());
      }
    } else {
      const v1::JobEvent& e = message.event();
      std::printf("%s  %-9s  %s\n", TimeString(e.time_unix_ms()).c_str(),
                  StateName(e.state()).c_str(), e.message().c_str());
    }
    std::fflush(stdout);
    first = false;
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) Fail(status);
  return last == v1::JOB_STATE_SUCCEEDED ? 0 : 1;
}

int Main(int argc, char** argv) {
  Args args(argc, argv);
  Global g;
  g.json = args.Extract("--json");  // accepted before or after the command
  if (const char* env = std::getenv("RINGMASTER_COORDINATOR"); env != nullptr && *env != '\0') {
    g.coordinator = env;
  } else {
    g.coordinator = "localhost:50051";
  }
  while (!args.Done() && absl::StartsWith(args.Peek(), "-")) {
    std::string flag = args.Next();
    if (flag == "--help" || flag == "-h") {
      std::printf("%s", kUsage);
      return 0;
    } else if (flag == "--coordinator") {
      g.coordinator = args.Value(flag);
    } else if (flag == "--json") {
      g.json = true;
    } else if (flag == "--timeout-seconds") {
      g.timeout_seconds = Number<double>(flag, args.Value(flag));
      if (!(g.timeout_seconds > 0)) Usage("--timeout-seconds must be positive");
    } else {
      Usage(absl::StrCat("unknown option '", flag, "'"));
    }
  }
  if (args.Done()) Usage("no command given");
  const std::string command = args.Next();
  auto channel = grpc::CreateChannel(g.coordinator, grpc::InsecureChannelCredentials());
  auto stub = v1::JobService::NewStub(channel);
  static const std::map<std::string, int (*)(const Global&, v1::JobService::Stub&, Args&)>
      kCommands = {{"submit", Submit}, {"jobs", Jobs},   {"status", Status},
                   {"cancel", Cancel}, {"watch", Watch}};
  auto it = kCommands.find(command);
  if (it == kCommands.end()) Usage(absl::StrCat("unknown command '", command, "'"));
  return it->second(g, *stub, args);
}

}  // namespace
}  // namespace ringmaster::cli

int main(int argc, char** argv) { return ringmaster::cli::Main(argc, argv); }
