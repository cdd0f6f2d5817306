// ringmaster-negotiation-bench: how fast the coordinator negotiates a model's gradients for N
// ranks.
//
//   logic  the Negotiator alone: every rank submits every tensor (full the first step, by cache id
//          after), then one Poll() answers the step;
//   grpc   N simulated workers on real Session streams to a coordinator (in-process unless
//          --coordinator is given), each submitting the step as one batch and waiting for its
//          answer.
//
// Reports steps/s, tensor-requests/s and per-step negotiation time p50/p99, one line (or JSON
// object) per (mode, ranks).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench/callback_ranks.h"
#include "bench/profile.h"
#include "bench/sim_worker.h"
#include "common/flags.h"
#include "common/logging.h"
#include "coordinator/negotiator.h"
#include "coordinator/server.h"
#include "grpcpp/grpcpp.h"
#include "ringmaster/v1/job.grpc.pb.h"

ABSL_FLAG(std::string, profile, "bench/profiles/resnet50.json", "model profile JSON");
ABSL_FLAG(std::string, ranks, "2,16,128,1024", "comma-separated rank counts");
ABSL_FLAG(std::string, mode, "logic,grpc", "logic, grpc, or both");
ABSL_FLAG(int, steps, 50, "measured steps");
ABSL_FLAG(int, warmup, 5, "unmeasured steps first (the first fills the response cache)");
ABSL_FLAG(int, max_grpc_ranks, 1024, "skip gRPC runs with more ranks than this");
ABSL_FLAG(std::string, coordinator, "", "coordinator address; empty: start one in-process");
ABSL_FLAG(int, processes_per_host, 8, "simulated workers per host name");
ABSL_FLAG(
    bool, relay, false,
    "--clients callback: the lowest rank of each simulated host (or group of --relay-hosts "
    "hosts) relays its ranks' batches and lists (RelayedBatches / RelayedResponses), as worker "
    "daemons with a negotiation relay do");
ABSL_FLAG(int, relay_hosts, 1,
          "with --relay: one relay for every N simulated hosts (the job knob "
          "negotiation_relay_hosts), as worker daemons relaying over TCP do");
ABSL_FLAG(int, coordinator_pid, 0,
          "--mode grpc --clients callback: the coordinator's process on this machine, whose CPU "
          "time over the measured steps is reported per step");
ABSL_FLAG(bool, json, false, "one JSON object per line");
ABSL_FLAG(int, cache_capacity, 1024, "response cache capacity (0: every request in full)");
ABSL_FLAG(
    std::string, clients, "callback",
    "how the simulated ranks run: callback (all streams driven by gRPC's callback API, little "
    "client CPU) or threads (a SimWorker with its own threads per rank)");

namespace ringmaster {
namespace {

struct Result {
  std::string mode;
  int ranks = 0;
  std::vector<double> step_seconds;
  // With callback clients: from the step's last message handed to gRPC to its last answer, the
  // coordinator's part of the step's wall clock (the simulated ranks' own work of preparing their
  // batches, which real ranks do in parallel on their hosts, is not in it).
  std::vector<double> answer_seconds;
  // The coordinator's CPU time over the measured steps, per step (--coordinator-pid); < 0: not
  // measured.
  double coordinator_cpu_ms_per_step = -1;
  // Its threads' context switches (voluntary and not) over those steps, per step; < 0 when not
  // measured. A thread that ends during the steps takes its count with it.
  double coordinator_switches_per_step = -1;
};

// The CPU time (user + system) process `pid` has used, in seconds; < 0 when it cannot be read.
double ProcessCpuSeconds(int pid) {
  std::FILE* f = std::fopen(absl::StrCat("/proc/", pid, "/stat").c_str(), "r");
  if (f == nullptr) return -1;
  char buffer[4096];
  const size_t n = std::fread(buffer, 1, sizeof(buffer) - 1, f);
  std::fclose(f);
  buffer[n] = '\0';
  // The fields after the command name (which may hold spaces): utime and stime are the 12th and
  // 13th of them (fields 14 and 15 of the line).
  const char* p = std::strrchr(buffer, ')');
  if (p == nullptr || p[1] == '\0') return -1;
  std::vector<std::string> fields = absl::StrSplit(p + 2, ' ');
  unsigned long long utime = 0, stime = 0;
  if (fields.size() < 13 || !absl::SimpleAtoi(fields[11], &utime) ||
      !absl::SimpleAtoi(fields[12], &stime)) {
    return -1;
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// The context switches of process `pid`'s threads so far (the sum over /proc/PID/task/*/status);
// < 0 when they cannot be read.
double ProcessContextSwitches(int pid) {
  std::error_code error;
  std::filesystem::directory_iterator tasks(absl::StrCat("/proc/", pid, "/task"), error);
  if (error) return -1;
  double total = 0;
  for (const std::filesystem::directory_entry& task : tasks) {
    std::ifstream status(task.path() / "status");
    std::string line;
    while (std::getline(status, line)) {
      // voluntary_ctxt_switches:	N and nonvoluntary_ctxt_switches:	N
      if (!absl::StrContains(line, "ctxt_switches:")) continue;
      double n = 0;
      if (absl::SimpleAtod(absl::StripAsciiWhitespace(line.substr(line.find(':') + 1)), &n)) {
        total += n;
      }
    }
  }
  return total;
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * (v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

void Report(const Result& r, const ModelProfile& profile) {
  double total = 0;
  for (double s : r.step_seconds) total += s;
  const double steps_per_s = r.step_seconds.size() / total;
  const double requests_per_s = steps_per_s * r.ranks * profile.tensors.size();
  const double p50 = Percentile(r.step_seconds, 0.5) * 1e3;
  const double p99 = Percentile(r.step_seconds, 0.99) * 1e3;
  const double answer_p50 = r.answer_seconds.empty() ? -1 : Percentile(r.answer_seconds, 0.5) * 1e3;
  if (absl::GetFlag(FLAGS_json)) {
    std::printf(
        "{\"bench\":\"negotiation\",\"mode\":\"%s\",\"profile\":\"%s\",\"ranks\":%d,\"tensors\":%"
        "zu,"
        "\"steps\":%zu,\"steps_per_s\":%.2f,\"tensor_requests_per_s\":%.0f,\"step_ms_p50\":%.3f,"
        "\"step_ms_p99\":%.3f,\"coordinator_cpu_ms_per_step\":%.3f,"
        "\"coordinator_switches_per_step\":%.1f,\"answer_ms_p50\":%.3f}\n",
        r.mode.c_str(), profile.model.c_str(), r.ranks, profile.tensors.size(),
        r.step_seconds.size(), steps_per_s, requests_per_s, p50, p99, r.coordinator_cpu_ms_per_step,
        r.coordinator_switches_per_step, answer_p50);
  } else {
    std::printf(
        "%-13s %-10s ranks=%5d  steps/s=%9.2f  tensor-requests/s=%11.0f  p50=%8.3f ms  "
        "p99=%8.3f ms%s%s%s\n",
        r.mode.c_str(), profile.model.c_str(), r.ranks, steps_per_s, requests_per_s, p50, p99,
        r.answer_seconds.empty() ? "" : absl::StrFormat("  answer-p50=%.3f ms", answer_p50).c_str(),
        r.coordinator_cpu_ms_per_step < 0
            ? ""
            : absl::StrFormat("  coordinator-cpu/step=%.3f ms", r.coordinator_cpu_ms_per_step)
                  .c_str(),
        r.coordinator_switches_per_step < 0
            ? ""
            : absl::StrFormat("  coordinator-switches/step=%.0f", r.coordinator_switches_per_step)
                  .c_str());
  }
  std::fflush(stdout);
}

std::vector<TensorRequest> Requests(const ModelProfile& profile) {
  std::vector<TensorRequest> out;
  for (const auto& t : profile.tensors) {
    TensorRequest r;
    r.name = t.name;
    r.type = RequestType::kAllreduce;
    r.dtype = DataType::kFloat32;
    r.shape = t.shape;
    out.push_back(std::move(r));
  }
  return out;
}

Result RunLogic(const ModelProfile& profile, int ranks, int warmup, int steps) {
  NegotiatorOptions options;
  options.job_id = "bench";
  options.cache_capacity = absl::GetFlag(FLAGS_cache_capacity);
  for (int r = 0; r < ranks; ++r) options.rank_hosts.push_back(absl::StrCat("host-", r / 8));
  Negotiator negotiator(options);
  const std::vector<TensorRequest> requests = Requests(profile);
  std::vector<std::vector<uint32_t>> ids(ranks);  // per rank, its cache ids once known
  Result result{absl::GetFlag(FLAGS_cache_capacity) > 0 ? "logic" : "logic-nocache", ranks, {}};
  for (int step = 0; step < warmup + steps; ++step) {
    const absl::Time start = absl::Now();
    for (int r = 0; r < ranks; ++r) {
      if (ids[r].empty()) {
        negotiator.Submit(r, requests, {}, start);
      } else {
        negotiator.Submit(r, {}, ids[r], start);
      }
    }
    std::optional<CycleOutput> out = negotiator.Poll(start);
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    if (!out) {
      std::fprintf(stderr, "logic: no output at step %d\n", step);
      std::exit(1);
    }
    if (ids[0].empty()) {
      std::vector<uint32_t> all;
      for (const CacheAssignment& a : out->cache_assignments) all.push_back(a.id);
      for (auto& v : ids) v = all;
    }
    if (step >= warmup) result.step_seconds.push_back(seconds);
  }
  return result;
}

// Runs `fn(i)` on `n` persistent threads once per Run(); Run() returns when all are done.
class Gang {
 public:
  Gang(int n, std::function<void(int)> fn) : fn_(std::move(fn)) {
    for (int i = 0; i < n; ++i) threads_.emplace_back([this, i] { Loop(i); });
  }
  ~Gang() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    for (auto& t : threads_) t.join();
  }
  void Run() {
    absl::MutexLock lock(&mu_);
    remaining_ = static_cast<int>(threads_.size());
    ++generation_;
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return remaining_ == 0; };
    mu_.Await(absl::Condition(&done));
  }

 private:
  void Loop(int i) {
    int64_t seen = 0;
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        auto go = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || generation_ > seen; };
        mu_.Await(absl::Condition(&go));
        if (stop_) return;
        seen = generation_;
      }
      fn_(i);
      absl::MutexLock lock(&mu_);
      --remaining_;
    }
  }
  std::function<void(int)> fn_;
  std::vector<std::thread> threads_;
  absl::Mutex mu_;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int remaining_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

// Registers the benchmark's job of `ranks` ranks; exits on failure.
void RegisterBenchJob(const std::shared_ptr<grpc::Channel>& channel, const ModelProfile& profile,
                      int ranks) {
  auto jobs = v1::JobService::NewStub(channel);
  v1::RegisterJobRequest request;
  request.mutable_spec()->set_name(absl::StrCat("negotiation-bench-", profile.model, "-", ranks));
  request.mutable_spec()->set_np(ranks);
  request.mutable_spec()->add_command("(simulated)");
  request.mutable_spec()->mutable_knobs()->set_cache_capacity(absl::GetFlag(FLAGS_cache_capacity));
  request.mutable_spec()->mutable_knobs()->set_negotiation_relay(absl::GetFlag(FLAGS_relay));
  request.mutable_spec()->mutable_knobs()->set_negotiation_relay_hosts(
      absl::GetFlag(FLAGS_relay_hosts));
  v1::RegisterJobResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  if (grpc::Status s = jobs->RegisterJob(&context, request, &response); !s.ok()) {
    std::fprintf(stderr, "grpc: RegisterJob: %s\n", s.error_message().c_str());
    std::exit(1);
  }
}

std::vector<v1::TensorRequest> ProfileRequests(const ModelProfile& profile) {
  std::vector<v1::TensorRequest> tensors;
  for (const auto& t : profile.tensors) {
    v1::TensorRequest r;
    r.set_name(t.name);
    r.set_type(v1::REQUEST_TYPE_ALLREDUCE);
    r.set_dtype(v1::DATA_TYPE_FLOAT32);
    for (int64_t d : t.shape) r.add_shape(d);
    tensors.push_back(std::move(r));
  }
  return tensors;
}

Result RunGrpcCallback(const ModelProfile& profile, int ranks, int warmup, int steps,
                       const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  const bool relay = absl::GetFlag(FLAGS_relay);
  auto connected =
      CallbackRanks::Connect(channel, ranks, std::max(1, absl::GetFlag(FLAGS_processes_per_host)),
                             absl::Seconds(30), relay, absl::GetFlag(FLAGS_relay_hosts));
  if (!connected.ok()) {
    std::fprintf(stderr, "grpc: %s\n", connected.status().ToString().c_str());
    std::exit(1);
  }
  CallbackRanks& sim = **connected;
  RegisterBenchJob(channel, profile, ranks);
  if (absl::Status s = sim.WaitAssignments(absl::Seconds(30)); !s.ok()) {
    std::fprintf(stderr, "grpc: %s\n", s.ToString().c_str());
    std::exit(1);
  }
  const std::vector<v1::TensorRequest> tensors = ProfileRequests(profile);
  Result result{absl::StrCat(absl::GetFlag(FLAGS_cache_capacity) > 0 ? "grpc" : "grpc-nocache",
                             relay ? "-relay" : "",
                             relay && absl::GetFlag(FLAGS_relay_hosts) > 1
                                 ? absl::StrCat("-h", absl::GetFlag(FLAGS_relay_hosts))
                                 : ""),
                ranks,
                {}};
  const int pid = absl::GetFlag(FLAGS_coordinator_pid);
  double cpu_start = -1, switches_start = -1;
  for (int step = 0; step < warmup + steps; ++step) {
    if (step == warmup && pid > 0) {
      cpu_start = ProcessCpuSeconds(pid);
      switches_start = ProcessContextSwitches(pid);
    }
    const absl::Time start = absl::Now();
    absl::Time last_sent;
    if (absl::Status s = sim.Step(tensors, absl::Seconds(60), &last_sent); !s.ok()) {
      std::fprintf(stderr, "grpc: step %d: %s\n", step, s.ToString().c_str());
      std::exit(1);
    }
    const absl::Time end = absl::Now();
    if (step >= warmup) {
      result.step_seconds.push_back(absl::ToDoubleSeconds(end - start));
      result.answer_seconds.push_back(absl::ToDoubleSeconds(end - last_sent));
    }
  }
  const double cpu_end = pid > 0 ? ProcessCpuSeconds(pid) : -1;
  const double switches_end = pid > 0 ? ProcessContextSwitches(pid) : -1;
  if (cpu_start >= 0 && cpu_end >= 0 && steps > 0) {
    result.coordinator_cpu_ms_per_step = (cpu_end - cpu_start) * 1e3 / steps;
  }
  if (switches_start >= 0 && switches_end >= switches_start && steps > 0) {
    result.coordinator_switches_per_step = (switches_end - switches_start) / steps;
  }
  sim.Close();
  absl::SleepFor(absl::Milliseconds(200));  // let the EXITED updates go out before the streams end
  return result;
}

Result RunGrpc(const ModelProfile& profile, int ranks, int warmup, int steps,
               const std::string& address) {
  if (absl::GetFlag(FLAGS_clients) == "callback") {
    return RunGrpcCallback(profile, ranks, warmup, steps, address);
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  const int per_host = std::max(1, absl::GetFlag(FLAGS_processes_per_host));
  std::vector<std::unique_ptr<SimWorker>> workers;
  for (int r = 0; r < ranks; ++r) {
    workers.push_back(std::make_unique<SimWorker>(channel, absl::StrCat("sim-", r / per_host)));
    if (absl::Status s = workers.back()->Connect(); !s.ok()) {
      std::fprintf(stderr, "grpc: worker %d: %s\n", r, s.ToString().c_str());
      std::exit(1);
    }
  }
  RegisterBenchJob(channel, profile, ranks);
  std::vector<v1::JobAssignment> assignments(ranks);
  for (int r = 0; r < ranks; ++r) {
    absl::StatusOr<v1::JobAssignment> a = workers[r]->WaitAssignment(absl::Seconds(30));
    if (!a.ok()) {
      std::fprintf(stderr, "grpc: assignment: %s\n", a.status().ToString().c_str());
      std::exit(1);
    }
    assignments[r] = *a;
    workers[r]->SendRankUpdate(*a, v1::RANK_STATE_STARTED, 0).IgnoreError();
  }
  const std::vector<v1::TensorRequest> tensors = ProfileRequests(profile);
  std::atomic<bool> failed{false};
  Gang gang(ranks, [&](int r) {
    auto out = workers[r]->Negotiate(assignments[r], tensors, absl::Seconds(60), false);
    if (!out.ok()) {
      std::fprintf(stderr, "grpc: rank %d: %s\n", r, out.status().ToString().c_str());
      failed = true;
    }
  });
  Result result{absl::GetFlag(FLAGS_cache_capacity) > 0 ? "grpc" : "grpc-nocache", ranks, {}};
  for (int step = 0; step < warmup + steps && !failed; ++step) {
    const absl::Time start = absl::Now();
    gang.Run();
    if (step >= warmup) result.step_seconds.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  if (failed) std::exit(1);
  for (int r = 0; r < ranks; ++r) {
    workers[r]->SendRankUpdate(assignments[r], v1::RANK_STATE_EXITED, 0).IgnoreError();
  }
  for (auto& w : workers) w->Close();
  return result;
}

int Main() {
  absl::StatusOr<ModelProfile> profile = LoadProfile(absl::GetFlag(FLAGS_profile));
  if (!profile.ok()) {
    std::fprintf(stderr, "%s\n", profile.status().ToString().c_str());
    return 2;
  }
  std::vector<int> ranks;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_ranks), ',')) {
    int n;
    if (!absl::SimpleAtoi(part, &n) || n < 1) {
      std::fprintf(stderr, "--ranks: '%s' is not a positive number\n", std::string(part).c_str());
      return 2;
    }
    ranks.push_back(n);
  }
  const std::string mode = absl::GetFlag(FLAGS_mode);
  const int warmup = std::max(1, absl::GetFlag(FLAGS_warmup));
  const int steps = std::max(1, absl::GetFlag(FLAGS_steps));
  if (absl::StrContains(mode, "logic")) {
    for (int n : ranks) Report(RunLogic(*profile, n, warmup, steps), *profile);
  }
  if (absl::StrContains(mode, "grpc")) {
    std::unique_ptr<CoordinatorServer> server;
    std::string address = absl::GetFlag(FLAGS_coordinator);
    if (address.empty()) {
      server = std::make_unique<CoordinatorServer>(CoordinatorOptions{});
      absl::StatusOr<int> port = server->Start("127.0.0.1:0");
      if (!port.ok()) {
        std::fprintf(stderr, "%s\n", port.status().ToString().c_str());
        return 1;
      }
      address = absl::StrCat("127.0.0.1:", *port);
    }
    for (int n : ranks) {
      if (n > absl::GetFlag(FLAGS_max_grpc_ranks)) continue;
      Report(RunGrpc(*profile, n, warmup, steps, address), *profile);
    }
  }
  return 0;
}

}  // namespace
}  // namespace ringmaster

int main(int argc, char** argv) {
  ringmaster::ConfigureDeadlockDetection();  // off unless asked for, as in the daemons
  ringmaster::KebabFlags flags(argc, argv);
  absl::ParseCommandLine(flags.argc(), flags.argv());
  ringmaster::InitLogging("error").IgnoreError();
  return ringmaster::Main();
}
