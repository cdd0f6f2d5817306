// ringmaster: the command-line client of the coordinator.
//
//   ringmaster [--coordinator ADDR:PORT] [--json] [--timeout-seconds S] COMMAND [ARGS]
//     submit --np N [--processes-per-host K] [--name NAME] [--env K=V]... [knobs] -- CMD ARGS...
//     jobs [--state STATE]...
//     status JOB
//     cancel JOB [--reason TEXT]
//     watch JOB
//     logs JOB [--rank R] [--follow]
//     artifacts JOB [--output DIR] [--list]
//     local --np N [--processes-per-host K] [--coordinator-port P] [options] -- CMD ARGS...
//
// The coordinator address comes from --coordinator, else $RINGMASTER_COORDINATOR, else
// localhost:50051. Exit status: 0 on success, 1 when the call fails (one line on stderr), 2 for a usage
// error; `watch` exits 0 when the job SUCCEEDED and 1 when it FAILED or was CANCELLED; `local` as
// documented in cli/local.h.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/artifacts.h"
#include "cli/command.h"
#include "cli/job_flags.h"
#include "cli/local.h"
#include "cli/log_printer.h"
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
  logs JOB [--rank R] [--follow]             print a job's output ("[R] " before each line of
                                             rank R unless --rank); --follow: until the job ends
  artifacts JOB [--output DIR] [--list]      fetch the job's timeline and autotune log into DIR
                                             (default: the current directory); --list: only list
  local --np N [options] -- CMD [ARGS...]    run a job on this machine: starts a coordinator and
                                             N workers, prints the output, exits with the job

submit and local options:
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
  --backend auto|gloo|nccl        collective backend (default auto)
Knobs also read Horovod's environment variables (HOROVOD_FUSION_THRESHOLD, HOROVOD_CYCLE_TIME, ...);
flags win over the environment.

local options (besides the above; --processes-per-host K simulates hosts local-0, local-1, ... of
K ranks each, default all on one):
  --coordinator-port P            the coordinator's port on 127.0.0.1 (default: any free port)
  --start-timeout-seconds S       fail when the workers have not all connected after S (default 60)
  --gpus                          worker i serves cuda:(i mod K) (K: processes per host) with NCCL
  --arena-mb MB                   the workers' shared arena per rank (default 1024, at least 16; the
                                  training process may use 3/4 of it: gradients, tensors in flight)
  --artifacts-output DIR          where the job's artifacts (timeline, autotune log) are written
                                  when it ends (default: the current directory)
)";

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
  if (job.has_throughput()) {
    const v1::JobThroughput& t = job.throughput();
    std::printf(
        "Live:      %.1f MB/s allreduced, %.2f steps/s, %.1f cycles/s (last 10 s); %lld tensors, "
        "%.1f MB since start; in force: fusion_threshold=%lld bytes, cycle_time=%g ms, "
        "cache=%s\n",
        t.bytes_per_second() / 1e6, t.steps_per_second(), t.cycles_per_second(),
        static_cast<long long>(t.tensors_negotiated()), t.bytes_negotiated() / 1e6,
        static_cast<long long>(t.fusion_threshold_bytes()), t.cycle_time_ms(),
        t.cache_enabled() ? "on" : "off");
    if (t.has_autotune()) {
      const v1::AutotuneStatus& a = t.autotune();
      std::printf(
          "Autotune:  %s, %d/%d samples; best so far: fusion_threshold=%lld bytes, "
          "cycle_time=%g ms, cache=%s at %.1f MB/s\n",
          a.phase().c_str(), a.samples(), a.max_samples(),
          static_cast<long long>(a.best_fusion_threshold_bytes()), a.best_cycle_time_ms(),
          a.best_cache_enabled() ? "on" : "off", a.best_score_bytes_per_second() / 1e6);
    }
  }
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

int Submit(const Global& g, v1::JobService::Stub& stub, Args& args) {
  std::map<std::string, std::string> requested_paths;
  v1::JobSpec spec = ParseJobSpec("submit", args, nullptr, &requested_paths);
  for (const auto& [name, path] : requested_paths) {
    std::fprintf(stderr,
                 "ringmaster: %s will be the job artifact '%s' (the coordinator keeps it): fetch it "
                 "with `ringmaster artifacts JOB`\n",
                 path.c_str(), name.c_str());
  }
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

int Logs(const Global& g, v1::JobService::Stub& stub, Args& args) {
  v1::GetLogsRequest request;
  request.set_job_id(JobArg(args, "logs"));
  request.set_all_ranks(true);
  while (!args.Done()) {
    std::string flag = args.Next();
    if (flag == "--rank") {
      const int32_t rank = Number<int32_t>(flag, args.Value(flag));
      if (rank < 0) Usage(absl::StrCat("--rank ", rank, " is negative"));
      request.set_all_ranks(false);
      request.set_rank(rank);
    } else if (flag == "--follow" || flag == "-f") {
      request.set_follow(true);
    } else {
      Usage(absl::StrCat("logs: unknown option '", flag, "'"));
    }
  }
  // Following lasts as long as the job; reading what is there has the usual deadline.
  std::unique_ptr<grpc::ClientContext> context =
      request.follow() ? std::make_unique<grpc::ClientContext>() : Context(g);
  auto reader = stub.GetLogs(context.get(), request);
  grpc::Status status = PrintLogs(*reader, request.all_ranks(), g.json);
  if (!status.ok()) Fail(status);
  return 0;
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
  // Before any channel exists: `local` forks its coordinator and workers.
  if (command == "local") return Local(g, args);
  auto channel = grpc::CreateChannel(g.coordinator, grpc::InsecureChannelCredentials());
  auto stub = v1::JobService::NewStub(channel);
  static const std::map<std::string, int (*)(const Global&, v1::JobService::Stub&, Args&)>
      kCommands = {{"submit", Submit}, {"jobs", Jobs},   {"status", Status},
                   {"cancel", Cancel}, {"watch", Watch}, {"logs", Logs},
                   {"artifacts", Artifacts}};
  auto it = kCommands.find(command);
  if (it == kCommands.end()) Usage(absl::StrCat("unknown command '", command, "'"));
  return it->second(g, *stub, args);
}

}  // namespace
}  // namespace ringmaster::cli

int main(int argc, char** argv) { return ringmaster::cli::Main(argc, argv); }
