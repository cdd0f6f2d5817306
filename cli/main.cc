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
// localhost:50051. Exit status: 0 on success, 1 when the call fails (one line on stderr), 2 for a
// usage error; `watch` exits 0 when the job SUCCEEDED and 1 when it FAILED or was CANCELLED;
// `local` as documented in cli/local.h.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/artifacts.h"
#include "cli/command.h"
#include "cli/job_flags.h"
#include "cli/local.h"
#include "cli/log_printer.h"
#include "common/coordinator_channels.h"
#include "common/source_archive.h"
#include "grpcpp/grpcpp.h"
#include "ringmaster/v1/cluster.grpc.pb.h"
#include "ringmaster/v1/job.grpc.pb.h"

namespace ringmaster::cli {
namespace {

namespace v1 = ringmaster::v1;

constexpr char kUsage[] =
    R"(usage: ringmaster [--coordinator ADDR:PORT] [--json] [--timeout-seconds S] COMMAND [ARGS]

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
  workers                                    list the worker daemons the coordinator knows
  local --np N [options] -- CMD [ARGS...]    run a job on this machine: starts a coordinator and
                                             N workers, prints the output, exits with the job

global options:
  --coordinator ADDR:PORT   the coordinator (default: $RINGMASTER_COORDINATOR, else localhost:50051);
                            replicas as ADDR:PORT,ADDR:PORT,... (the leader is found)
  --json                    print replies as JSON, one message per line
  --timeout-seconds S       deadline of each call (default 10)
  --tls-ca F                the CA of the coordinator's certificate: use TLS (env RINGMASTER_TLS_CA)
  --tls-cert F, --tls-key F a user certificate and its key (env RINGMASTER_TLS_CERT, _KEY)
  --token T                 a bearer token from the coordinator's token file (env RINGMASTER_TOKEN)
  --insecure                plaintext, ignoring RINGMASTER_TLS_* (a loopback coordinator)

`ringmaster COMMAND --help` lists a command's own options.
)";

constexpr char kSubmitHelp[] = R"(usage: ringmaster submit --np N [options] -- CMD [ARGS...]

Registers a job of N ranks running CMD; prints its id, name and state. The job's processes start in
the current directory (--working-dir to change it) with the caller's PATH, PYTHONPATH, HOME, LANG,
LC_ALL and every HOROVOD_*, RINGMASTER_* and NCCL_* variable (--no-inherit-env: only --env).

options:
  --no-inherit-env                pass none of the caller's environment, and the workers' own
                                  working directory unless --working-dir
  --source-dir DIR                ship DIR with the job (a tar.gz archive, at most the
                                  coordinator's --max-source-bytes, default 64 MiB): each rank runs
                                  CMD in its own unpacked copy (RINGMASTER_CODE_DIR)
  --hyperparameter KEY=VALUE      pass "--KEY VALUE" to CMD, as SageMaker passes hyperparameters
                                  (repeatable, in order)
  --channel NAME=PATH             an input channel: PATH in RINGMASTER_CHANNEL_<NAME> and
                                  SM_CHANNEL_<NAME> (NAME upper-cased; repeatable)
  --attached                      no command: the ranks are training processes started elsewhere
                                  (e.g. a Kubernetes Indexed Job's pods) that attach to their
                                  host's worker with RINGMASTER_ATTACH_JOB=NAME and
                                  RINGMASTER_ATTACH_RANK (or JOB_COMPLETION_INDEX); each rank is
                                  placed on the worker its process attached to, and the job starts
                                  when all N are claimed. --name is what they attach by

Every rank also gets RINGMASTER_OUTPUT_DIR (and SM_OUTPUT_DATA_DIR, SM_MODEL_DIR): what it writes
there comes back as the job's artifacts rank-<rank>/<path> (`ringmaster artifacts JOB`).
)";

constexpr char kJobsHelp[] = R"(usage: ringmaster jobs [--state STATE]...

Lists jobs, newest first: id, name, state, ranks, age and reason.

options:
  --state STATE   only jobs in STATE (PENDING, STARTING, RUNNING, SUCCEEDED, FAILED, CANCELLED);
                  repeatable
)";

constexpr char kStatusHelp[] = R"(usage: ringmaster status JOB [--watch] [--interval SECONDS]

Prints a job: state, why it waits (PENDING) or why it ended, ranks (host, device, worker, local and
cross rank, state, exit status), knobs, throughput (live while it runs, the last figures after), the
slowest ranks while it runs, and events.

options:
  --watch             print it again every interval (the screen cleared on a terminal; with --json,
                      one object per line) until the job has ended
  --interval SECONDS  with --watch: how often (default 2)
)";

constexpr char kCancelHelp[] = R"(usage: ringmaster cancel JOB [--reason TEXT]

Cancels a job: its ranks are stopped and it ends CANCELLED.

options:
  --reason TEXT   recorded as the job's reason ("cancelled: TEXT")
)";

constexpr char kWatchHelp[] = R"(usage: ringmaster watch JOB

Prints a job's events (those so far, then each as it happens) until the job ends. Exits 0 when it
SUCCEEDED, 1 when it FAILED or was CANCELLED.
)";

constexpr char kLogsHelp[] = R"(usage: ringmaster logs JOB [--rank R] [--follow]

Prints a job's output, "[R] " before each line of rank R.

options:
  --rank R        only rank R's output, without the prefix
  --follow, -f    keep printing new output until the job ends
)";

constexpr char kArtifactsHelp[] = R"(usage: ringmaster artifacts JOB [--output DIR] [--list]

Fetches the job's artifacts (its timeline and autotune log) into DIR.

options:
  --output DIR, -o DIR   where to write them (default: the current directory)
  --list                 only list them, with their sizes
)";

constexpr char kWorkersHelp[] = R"(usage: ringmaster workers

Lists the worker daemons the coordinator knows, by host and device: id, host, device, state (IDLE,
BUSY, DISCONNECTED, LOST), the job and rank it serves, and how long ago it last sent a heartbeat.
)";

constexpr char kLocalHelp[] = R"(usage: ringmaster local --np N [options] -- CMD [ARGS...]

Runs a job on this machine: starts a coordinator and N worker daemons on 127.0.0.1, prints each
rank's output prefixed "[R] ", and exits with the job's status (0 when it succeeded). Ctrl-C stops
it all.

options (besides the job options below; --processes-per-host K simulates hosts local-0, local-1,
... of K ranks each, default all on one):
  --coordinator-port P            the coordinator's port on 127.0.0.1 (default: any free port)
  --metrics-port-base P           serve metrics: the coordinator on port P, worker i on P+1+i
                                  (default: no metrics)
  --start-timeout-seconds S       fail when the workers have not all connected after S (default 60)
  --gpus                          worker i serves cuda:(i mod K) (K: processes per host) with NCCL
  --arena-mb MB                   the workers' shared arena per rank (default 1024, at least 16; the
                                  training process may use 3/4 of it: gradients, tensors in flight)
  --artifacts-output DIR          where the job's artifacts (timeline, autotune log) are written
                                  when it ends (default: the current directory)
)";

// A command's --help: its own text, and the job options for the two that take them.
std::string HelpOf(const std::string& command) {
  static const std::map<std::string, const char*> kHelp = {
      {"submit", kSubmitHelp},       {"jobs", kJobsHelp},       {"status", kStatusHelp},
      {"cancel", kCancelHelp},       {"watch", kWatchHelp},     {"logs", kLogsHelp},
      {"artifacts", kArtifactsHelp}, {"workers", kWorkersHelp}, {"local", kLocalHelp}};
  auto it = kHelp.find(command);
  if (it == kHelp.end()) return kUsage;
  std::string help = it->second;
  if (command == "submit" || command == "local") absl::StrAppend(&help, "\n", kJobOptionsHelp);
  return help;
}

// How long a command waits for the coordinator to accept its connection before calling anyway.
constexpr double kConnectGraceSeconds = 3;

// Of the coordinator's replicas (--coordinator a:1,b:2), the one that leads: each is asked in turn
// (a follower's refusal names the leader, asked next), round after round while none leads yet (a
// takeover under way), until the command's timeout. The first address when none answers: the
// command then fails as usual, naming it.
std::string FindLeader(const Global& g) {
  absl::StatusOr<std::unique_ptr<CoordinatorChannels>> channels =
      CoordinatorChannels::Create(g.coordinator, MakeChannelCredentials(g.tls));
  if (!channels.ok()) Usage(std::string(channels.status().message()));
  if ((*channels)->size() == 1) return g.coordinator;
  const std::string first = (*channels)->current_address();
  const absl::Time end = absl::Now() + absl::Seconds(g.timeout_seconds);
  while (absl::Now() < end) {
    for (size_t i = 0; i < (*channels)->size(); ++i) {
      const std::shared_ptr<grpc::Channel> channel = (*channels)->Current();
      std::unique_ptr<grpc::ClientContext> context = Context(g);
      context->set_deadline(absl::ToChronoTime(std::min(end, absl::Now() + absl::Seconds(2))));
      v1::ListJobsRequest request;
      request.set_page_size(1);
      v1::ListJobsResponse response;
      const grpc::Status s =
          v1::JobService::NewStub(channel)->ListJobs(context.get(), request, &response);
      // Anything but "not here" (a refusal of this user included) comes from the leader.
      if (s.error_code() != grpc::StatusCode::UNAVAILABLE &&
          s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
        return (*channels)->current_address();
      }
      (*channels)->Failed(channel, CoordinatorChannels::LeaderHint(*context));
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  return first;
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
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::FromUnixMillis(unix_ms),
                          absl::UTCTimeZone());
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

// A data rate for people: "12.3 MB/s", "1.24 GB/s".
std::string Rate(double bytes_per_second) {
  if (bytes_per_second >= 1e9) return absl::StrFormat("%.2f GB/s", bytes_per_second / 1e9);
  return absl::StrFormat("%.1f MB/s", bytes_per_second / 1e6);
}

// Who is slow: the slowest ranks over the last steps, and the one named as holding the job back.
void PrintStragglers(const v1::Stragglers& st) {
  std::printf("Slowest:   over the last %d steps, to step %lld (median step %.1f ms): %s\n",
              st.steps(), static_cast<long long>(st.last_step()), st.step_seconds() * 1e3,
              st.straggler_rank() >= 0
                  ? absl::StrCat("rank ", st.straggler_rank(), " holds the job back").c_str()
                  : "no rank holds the job back");
  std::vector<std::vector<std::string>> rows = {{"  RANK", "HOST", "WORKER", "BEHIND MEDIAN",
                                                 "BEHIND FIRST", "IN COLLECTIVES", "ACROSS HOSTS",
                                                 "LINK SENDS", "VERDICT"}};
  for (const v1::RankLateness& r : st.slowest()) {
    rows.push_back({absl::StrCat("  ", r.rank()), r.host(), r.worker_id(),
                    absl::StrFormat("%.1f ms", r.behind_median_seconds() * 1e3),
                    absl::StrFormat("%.1f ms", r.behind_first_seconds() * 1e3),
                    r.measured() ? absl::StrFormat("%.0f%%", r.collective_share() * 100) : "-",
                    r.measured() ? absl::StrFormat("%.0f%%", r.network_share() * 100) : "-",
                    r.link_bytes_per_second() > 0 ? Rate(r.link_bytes_per_second()) : "-",
                    r.verdict().empty() ? "-" : r.verdict()});
  }
  PrintTable(rows);
}

void PrintJob(const v1::Job& job) {
  const v1::JobSpec& s = job.spec();
  std::printf("Job:       %s\n", job.id().c_str());
  std::printf("Name:      %s\n", s.name().c_str());
  std::printf("State:     %s\n", StateName(job.state()).c_str());
  if (!job.waiting_reason().empty()) std::printf("Waiting:   %s\n", job.waiting_reason().c_str());
  if (!job.reason().empty()) {
    // A multi-line reason (a failed rank's last output) is indented under its first line.
    std::printf("Reason:    %s\n",
                absl::StrReplaceAll(job.reason(), {{"\n", "\n           "}}).c_str());
  }
  std::printf("Ranks:     %d (%s)\n", s.np(),
              s.processes_per_host() > 0
                  ? absl::StrCat("at most ", s.processes_per_host(), " per host").c_str()
                  : "no per-host limit");
  if (s.min_np() > 0 || s.max_np() > 0) {
    std::printf("Elastic:   %d..%d ranks, %d resets%s, elastic timeout %d s\n", s.min_np(),
                s.max_np(), job.resets(),
                s.reset_limit() > 0 ? absl::StrCat(" of at most ", s.reset_limit()).c_str() : "",
                s.elastic_timeout_seconds() > 0 ? s.elastic_timeout_seconds() : 600);
  }
  if (s.max_run_seconds() > 0) std::printf("Time limit: %d s (max run)\n", s.max_run_seconds());
  std::printf("Epoch:     %lld\n", static_cast<long long>(job.epoch()));
  std::printf("Created:   %s\n", TimeString(job.create_time_unix_ms()).c_str());
  std::printf("Command:   %s\n", s.command().empty() ? "(processes attach to their workers)"
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
    const bool ended = job.state() == v1::JOB_STATE_SUCCEEDED ||
                       job.state() == v1::JOB_STATE_FAILED ||
                       job.state() == v1::JOB_STATE_CANCELLED;
    std::printf(
        "%s %.1f MB/s allreduced, %.2f steps/s, %.1f cycles/s (%s); %lld tensors, "
        "%.1f MB since start; %s: fusion_threshold=%lld bytes, cycle_time=%g ms, "
        "cache=%s\n",
        ended ? "Last:     " : "Live:     ", t.bytes_per_second() / 1e6, t.steps_per_second(),
        t.cycles_per_second(), ended ? "its last 10 s" : "last 10 s",
        static_cast<long long>(t.tensors_negotiated()), t.bytes_negotiated() / 1e6,
        ended ? "at its end" : "in force", static_cast<long long>(t.fusion_threshold_bytes()),
        t.cycle_time_ms(), t.cache_enabled() ? "on" : "off");
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
  if (job.has_stragglers()) PrintStragglers(job.stragglers());
  if (job.ranks_size() > 0) {
    std::printf("\n");
    std::vector<std::vector<std::string>> rows = {
        {"RANK", "HOST", "ADDRESS", "DEVICE", "WORKER", "LOCAL", "CROSS", "STATE", "EXIT"}};
    for (const v1::RankInfo& r : job.ranks()) {
      rows.push_back({absl::StrCat(r.rank()), r.host(), r.address().empty() ? "-" : r.address(),
                      r.device(), r.worker_id(), absl::StrCat(r.local_rank(), "/", r.local_size()),
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
  bool inherit = true;
  std::string source_dir;
  std::vector<std::pair<std::string, std::string>> hyperparameters;
  std::vector<std::pair<std::string, std::string>> channels;
  bool attached = false;
  v1::JobSpec spec = ParseJobSpec(
      "submit", args,
      [&](const std::string& flag, Args& a) {
        if (flag == "--no-inherit-env") {
          inherit = false;
        } else if (flag == "--attached") {
          attached = true;
        } else if (flag == "--source-dir") {
          source_dir = a.Value(flag);
        } else if (flag == "--hyperparameter") {
          hyperparameters.push_back(KeyValue(flag, a.Value(flag)));
        } else if (flag == "--channel") {
          channels.push_back(KeyValue(flag, a.Value(flag)));
        } else {
          return false;
        }
        return true;
      },
      &requested_paths);
  // As SageMaker passes them: each hyperparameter as "--KEY VALUE" after the entry point, each
  // channel's path in RINGMASTER_CHANNEL_<NAME> and SM_CHANNEL_<NAME>.
  for (const auto& [key, value] : hyperparameters) {
    spec.add_command(absl::StrCat("--", key));
    spec.add_command(value);
  }
  std::vector<std::string> channel_names;
  for (const auto& [name, path] : channels) {
    const bool plain = !name.empty() && absl::ascii_isalpha(name[0]) &&
                       std::all_of(name.begin(), name.end(),
                                   [](char c) { return absl::ascii_isalnum(c) || c == '_'; });
    if (!plain) {
      Usage(absl::StrCat("--channel '", name,
                         "': a channel name is a letter then letters, digits or '_'"));
    }
    const std::string upper = absl::AsciiStrToUpper(name);
    (*spec.mutable_env())[absl::StrCat("RINGMASTER_CHANNEL_", upper)] = path;
    (*spec.mutable_env())[absl::StrCat("SM_CHANNEL_", upper)] = path;
    channel_names.push_back(absl::StrCat("\"", name, "\""));
  }
  if (!channels.empty()) {
    (*spec.mutable_env())["SM_CHANNELS"] =
        absl::StrCat("[", absl::StrJoin(channel_names, ","), "]");
  }
  if (attached) {
    if (!spec.command().empty() || !source_dir.empty()) {
      Usage(
          "submit --attached takes no command and no --source-dir: its ranks are the training "
          "processes that attach to their hosts' workers naming the job (RINGMASTER_ATTACH_JOB)");
    }
    spec.set_attached(true);
    inherit = false;  // its processes are not started by the workers
  }
  if (!source_dir.empty() && spec.command().empty()) {
    Usage("submit --source-dir needs the entry point to run: -- python3 train.py");
  }
  if (!source_dir.empty() && !spec.working_dir().empty()) {
    Usage(
        "submit: --source-dir and --working-dir exclude each other (the ranks run in the "
        "unpacked source directory)");
  }
  // As Horovod's launchers do: the job runs where and with what the caller runs.
  if (inherit) {
    if (spec.working_dir().empty() && source_dir.empty()) {
      std::error_code error;
      spec.set_working_dir(std::filesystem::current_path(error).string());
    }
    InheritCallerEnvironment(ExecutableDir(), &spec);
  }
  for (const auto& [name, path] : requested_paths) {
    std::fprintf(
        stderr,
        "ringmaster: %s will be the job artifact '%s' (the coordinator keeps it): fetch it "
        "with `ringmaster artifacts JOB`\n",
        path.c_str(), name.c_str());
  }
  // Its registration is idempotent (JobSpec.request_id): one that may have gone through without
  // our hearing of it (the coordinator busy, a connection lost) is retried without a second job.
  if (spec.request_id().empty()) {
    absl::BitGen random;
    spec.set_request_id(absl::StrFormat("submit-%016x%016x", absl::Uniform<uint64_t>(random),
                                        absl::Uniform<uint64_t>(random)));
  }
  v1::RegisterJobResponse response;
  grpc::Status status;
  if (source_dir.empty()) {
    v1::RegisterJobRequest request;
    *request.mutable_spec() = spec;
    for (int attempt = 1;; ++attempt) {
      status = stub.RegisterJob(Context(g).get(), request, &response);
      const bool transient = status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                             status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
                             (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
                              absl::StrContains(status.error_message(), "retry in a moment"));
      if (!transient || attempt == 3) break;
      absl::SleepFor(absl::Seconds(attempt));
    }
  } else {
    // Packed in memory up to 1 GiB; the coordinator's own limit (--max-source-bytes) is checked
    // as the archive arrives.
    absl::StatusOr<std::string> archive = PackDirectory(source_dir, int64_t{1} << 30);
    if (!archive.ok()) Usage(std::string(archive.status().message()));
    std::unique_ptr<grpc::ClientContext> context = StreamContext(g);
    // Long enough for the archive on a slow link, bounded all the same.
    context->set_deadline(std::chrono::system_clock::now() +
                          std::chrono::seconds(static_cast<int64_t>(g.timeout_seconds) + 300));
    std::unique_ptr<grpc::ClientWriter<v1::SubmitJobRequest>> writer =
        stub.SubmitJob(context.get(), &response);
    v1::SubmitJobRequest m;
    *m.mutable_spec() = spec;
    bool open = writer->Write(m);
    constexpr size_t kChunk = size_t{1} << 20;
    for (size_t at = 0; open && at < archive->size(); at += kChunk) {
      v1::SubmitJobRequest chunk;
      chunk.set_source_chunk(archive->substr(at, kChunk));
      open = writer->Write(chunk);
    }
    if (open) writer->WritesDone();
    status = writer->Finish();
  }
  if (!status.ok()) Fail(g, status);
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
  // Every page, each within the call's limits.
  v1::ListJobsResponse response;
  for (int pages = 0; pages < 10'000; ++pages) {
    v1::ListJobsResponse one;
    grpc::Status status = stub.ListJobs(Context(g).get(), request, &one);
    if (!status.ok()) Fail(g, status);
    for (v1::Job& job : *one.mutable_jobs()) *response.add_jobs() = std::move(job);
    if (one.next_page_token().empty()) break;
    request.set_page_token(one.next_page_token());
  }
  if (g.json) {
    std::printf("%s\n", Json(response).c_str());
    return 0;
  }
  std::vector<std::vector<std::string>> rows = {{"JOB", "NAME", "STATE", "NP", "AGE", "REASON"}};
  for (const v1::Job& job : response.jobs()) {
    rows.push_back({job.id(), job.spec().name(), StateName(job.state()),
                    absl::StrCat(job.spec().np()), Age(job.create_time_unix_ms()),
                    // The first line (a failed rank's last output follows in `status`).
                    std::string(job.reason().substr(0, job.reason().find('\n')))});
  }
  PrintTable(rows);
  return 0;
}

std::string JobArg(Args& args, const char* command) {
  if (args.Done() || absl::StartsWith(args.Peek(), "--"))
    Usage(absl::StrCat(command, " needs JOB"));
  return args.Next();
}

bool Ended(const v1::Job& job) {
  return job.state() == v1::JOB_STATE_SUCCEEDED || job.state() == v1::JOB_STATE_FAILED ||
         job.state() == v1::JOB_STATE_CANCELLED;
}

int Status(const Global& g, v1::JobService::Stub& stub, Args& args) {
  v1::GetJobRequest request;
  request.set_job_id(JobArg(args, "status"));
  bool watch = false;
  double interval = 2;
  while (!args.Done()) {
    std::string flag = args.Next();
    if (flag == "--watch") {
      watch = true;
    } else if (flag == "--interval") {
      const std::string value = args.Value(flag);
      if (!absl::SimpleAtod(value, &interval) || !(interval >= 0.1 && interval <= 3600)) {
        Usage(absl::StrCat("status: --interval '", value, "' is not a number of seconds in [0.1, ",
                           "3600]"));
      }
    } else {
      Usage(absl::StrCat("status: unexpected '", flag, "'"));
    }
  }
  const bool terminal = isatty(STDOUT_FILENO) != 0;
  while (true) {
    v1::GetJobResponse response;
    grpc::Status status = stub.GetJob(Context(g).get(), request, &response);
    if (!status.ok()) Fail(g, status);
    if (g.json) {
      std::printf("%s\n", Json(response.job()).c_str());
    } else {
      if (watch && terminal) std::printf("\033[H\033[2J");  // the screen cleared: a live view
      PrintJob(response.job());
    }
    std::fflush(stdout);
    if (!watch || Ended(response.job())) return 0;
    absl::SleepFor(absl::Seconds(interval));
  }
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
  if (!status.ok()) Fail(g, status);
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
  // No deadline: a watch lasts as long as the job.
  std::unique_ptr<grpc::ClientContext> context = StreamContext(g);
  auto reader = stub.WatchJob(context.get(), request);
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
  if (!status.ok()) Fail(g, status);
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
  std::unique_ptr<grpc::ClientContext> context = request.follow() ? StreamContext(g) : Context(g);
  auto reader = stub.GetLogs(context.get(), request);
  grpc::Status status = PrintLogs(*reader, request.all_ranks(), g.json);
  if (!status.ok()) Fail(g, status);
  return 0;
}

std::string WorkerStateName(v1::WorkerState state) {
  std::string name = v1::WorkerState_Name(state);
  return absl::StartsWith(name, "WORKER_STATE_") ? name.substr(13) : name;
}

int Workers(const Global& g, v1::ClusterService::Stub& stub, Args& args) {
  if (!args.Done()) Usage(absl::StrCat("workers: unexpected '", args.Peek(), "'"));
  v1::ListWorkersResponse response;
  grpc::Status status = stub.ListWorkers(Context(g).get(), v1::ListWorkersRequest(), &response);
  if (!status.ok()) Fail(g, status);
  if (g.json) {
    std::printf("%s\n", Json(response).c_str());
    return 0;
  }
  if (response.workers().empty()) {
    std::printf(
        "no workers registered with the coordinator at %s; start one with:\n"
        "  ringmaster-worker --coordinator %s --device cpu\n",
        g.coordinator.c_str(), g.coordinator.c_str());
    return 0;
  }
  std::vector<std::vector<std::string>> rows = {
      {"WORKER", "HOST", "ADDRESS", "DEVICE", "STATE", "JOB", "RANK", "HEARTBEAT"}};
  for (const v1::WorkerInfo& w : response.workers()) {
    rows.push_back({w.worker_id(), w.host(), w.address().empty() ? "-" : w.address(), w.device(),
                    WorkerStateName(w.state()), w.job_id().empty() ? "-" : w.job_id(),
                    w.job_id().empty() ? "-" : absl::StrCat(w.rank()),
                    absl::StrCat(Age(w.last_heartbeat_unix_ms()), " ago")});
  }
  PrintTable(rows);
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
  if (const char* env = std::getenv("RINGMASTER_TOKEN"); env != nullptr) g.token = env;
  std::string tls_ca, tls_cert, tls_key;
  bool insecure = false;
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
    } else if (flag == "--tls-ca") {
      tls_ca = args.Value(flag);
    } else if (flag == "--tls-cert") {
      tls_cert = args.Value(flag);
    } else if (flag == "--tls-key") {
      tls_key = args.Value(flag);
    } else if (flag == "--token") {
      g.token = args.Value(flag);
    } else if (flag == "--insecure") {
      insecure = true;
    } else {
      Usage(absl::StrCat("unknown option '", flag, "'"));
    }
  }
  if (args.Done()) Usage("no command given");
  const std::string command = args.Next();
  HelpIfAsked(args, HelpOf(command));
  // Before any channel exists: `local` forks its coordinator and workers.
  if (command == "local") return Local(g, args);
  if (insecure && (!tls_ca.empty() || !tls_cert.empty() || !tls_key.empty())) {
    Usage("--insecure and --tls-* exclude each other");
  }
  if (!insecure) g.tls = TlsFilesFrom(tls_cert, tls_key, tls_ca);
  if (g.tls.enabled()) {
    if (absl::Status s = CheckClientTlsFiles(g.tls); !s.ok()) Usage(std::string(s.message()));
  }
  g.coordinator = FindLeader(g);
  auto channel = grpc::CreateChannel(g.coordinator, MakeChannelCredentials(g.tls));
  // A coordinator started a moment ago (`ringmaster-coordinator ... &` in a script) is given a
  // moment to listen; one that stays away fails the call at once, with gRPC's reason.
  channel->WaitForConnected(std::chrono::system_clock::now() +
                            std::chrono::milliseconds(static_cast<int64_t>(
                                std::min(g.timeout_seconds, kConnectGraceSeconds) * 1000)));
  if (command == "workers") {
    auto cluster = v1::ClusterService::NewStub(channel);
    return Workers(g, *cluster, args);
  }
  auto stub = v1::JobService::NewStub(channel);
  static const std::map<std::string, int (*)(const Global&, v1::JobService::Stub&, Args&)>
      kCommands = {{"submit", Submit}, {"jobs", Jobs}, {"status", Status},      {"cancel", Cancel},
                   {"watch", Watch},   {"logs", Logs}, {"artifacts", Artifacts}};
  auto it = kCommands.find(command);
  if (it == kCommands.end()) Usage(absl::StrCat("unknown command '", command, "'"));
  return it->second(g, *stub, args);
}

}  // namespace
}  // namespace ringmaster::cli

int main(int argc, char** argv) { return ringmaster::cli::Main(argc, argv); }
