// ringmaster-bench: run as every rank of a job (`ringmaster local --np 2 -- ringmaster-bench ...`).
// Replays a model profile: every step enqueues all gradient tensors in backward order
// asynchronously, then waits for all — the whole path (client -> daemon -> coordinator negotiation
// -> fused Gloo allreduce). In the same run, the raw-Gloo baseline allreduces the same bytes as one
// buffer among the same ranks. Rank 0 prints median step time, bytes per step, bus bandwidth and
// the bandwidth ratio to raw Gloo (higher is better; 1 = as fast) beside the step-time ratio;
// --json prints one JSON object per line.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "bench/profile.h"
#include "common/flags.h"
#include "common/tls.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "ringmaster/client.h"
#include "worker/cpu/gloo_backend.h"
#include "worker/rendezvous/rendezvous_client.h"

ABSL_FLAG(std::string, profile, "bench/profiles/resnet50.json", "model profile JSON");
ABSL_FLAG(int, steps, 20, "measured steps");
ABSL_FLAG(int, warmup, 3, "unmeasured steps first");
ABSL_FLAG(bool, json, false, "one JSON object per line");
ABSL_FLAG(
    std::string, op, "sum",
    "sum (what the yardsticks compute) or average (Horovod's default: a sum, then a division)");
ABSL_FLAG(bool, baseline, true, "also time raw Gloo on one buffer of the same bytes");
ABSL_FLAG(
    int, measure_last, 0,
    "report the median of only the last N measured steps (0: all), e.g. after autotune settled");
ABSL_FLAG(
    int, latency_iterations, 0,
    "instead of the profile: allreduce one float32 this many times, one at a time, and report "
    "p50/p99 latency");
ABSL_FLAG(int64_t, allgather_bytes, 0,
          "instead of the profile: allgather this many bytes from every rank, --steps times after "
          "--warmup, and report the median next to raw Gloo's allgather of the same bytes");

namespace ringmaster {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

// The slowest rank's time: the step ends when the last rank ends.
absl::StatusOr<double> MaxOverRanks(Client& c, double seconds, const std::string& name) {
  double* v = static_cast<double*>(c.Allocate(sizeof(double)));
  *v = seconds;
  auto h = c.AllreduceAsync(name, v, DataType::kFloat64, {1}, ReduceOp::kMax);
  if (!h.ok()) return h.status();
  if (absl::Status s = c.Wait(*h); !s.ok()) return s;
  const double out = *v;
  c.Free(v);
  return out;
}

void Print(const std::string& system, const ModelProfile& p, int np, int tensors, double seconds,
           double baseline) {
  const double bytes = static_cast<double>(p.bytes_fp32);
  const double busbw = 2.0 * (np - 1) / np * bytes / seconds / 1e9;
  if (absl::GetFlag(FLAGS_json)) {
    std::printf(
        "{\"system\":\"%s\",\"profile\":\"%s\",\"np\":%d,\"tensors\":%d,"
        "\"bytes_per_step\":%lld,\"step_time_s_median\":%.6f,\"busbw_gbs\":%.4f%s}\n",
        system.c_str(), p.model.c_str(), np, tensors, static_cast<long long>(p.bytes_fp32), seconds,
        busbw,
        baseline > 0 ? absl::StrCat(",\"busbw_ratio_to_raw_gloo\":", baseline / seconds,
                                    ",\"step_time_ratio_to_raw_gloo\":", seconds / baseline)
                           .c_str()
                     : "");
  } else {
    std::printf(
        "%-22s %-22s np=%d tensors=%-4d bytes/step=%lld  step median=%8.3f ms  "
        "busbw=%6.3f GB/s%s\n",
        system.c_str(), p.model.c_str(), np, tensors, static_cast<long long>(p.bytes_fp32),
        seconds * 1e3, busbw,
        // Bandwidth against raw Gloo (1 = as fast; higher is better), and the step-time ratio.
        baseline > 0 ? absl::StrFormat("  busbw %.3fx raw gloo (step time %.3fx)",
                                       baseline / seconds, seconds / baseline)
                           .c_str()
                     : "");
  }
  std::fflush(stdout);
}

int Latency(Client& c, int iterations) {
  float* x = static_cast<float*>(c.Allocate(sizeof(float)));
  std::vector<double> times;
  for (int i = 0; i < iterations + 10; ++i) {
    *x = 1;
    const absl::Time start = absl::Now();
    auto h = c.AllreduceAsync("latency", x, DataType::kFloat32, {1}, ReduceOp::kSum);
    absl::Status s = h.ok() ? c.Wait(*h) : h.status();
    if (!s.ok()) {
      std::fprintf(stderr, "allreduce: %s\n", s.ToString().c_str());
      return 1;
    }
    if (i >= 10) times.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  std::sort(times.begin(), times.end());
  const double p50 = times[times.size() / 2], p99 = times[times.size() * 99 / 100];
  if (c.rank() == 0) {
    if (absl::GetFlag(FLAGS_json)) {
      std::printf(
          "{\"system\":\"ringmaster\",\"bench\":\"latency\",\"np\":%d,\"bytes\":4,"
          "\"iterations\":%d,\"p50_ms\":%.4f,\"p99_ms\":%.4f}\n",
          c.size(), iterations, p50 * 1e3, p99 * 1e3);
    } else {
      std::printf("ringmaster 4-byte allreduce np=%d iterations=%d  p50=%.3f ms  p99=%.3f ms\n",
                  c.size(), iterations, p50 * 1e3, p99 * 1e3);
    }
  }
  c.Shutdown();
  return 0;
}

// Raw Gloo among the job's ranks, rendezvous through the coordinator's store under `prefix`.
absl::StatusOr<std::unique_ptr<Backend>> RawGloo(Client& c, const std::string& prefix) {
  const std::string coordinator = Env("RINGMASTER_COORDINATOR");
  int64_t epoch = 0;
  absl::SimpleAtoi(Env("RINGMASTER_EPOCH"), &epoch);
  GlooBackendOptions g;
  g.rank = c.rank();
  g.size = c.size();
  // TLS when the daemon (whose environment the ranks inherit) reaches it with TLS.
  absl::StatusOr<std::unique_ptr<CoordinatorChannels>> channels =
      CoordinatorChannels::Create(coordinator, MakeChannelCredentials(TlsFilesFrom("", "", "")));
  if (!channels.ok()) return channels.status();
  g.store = std::make_shared<RendezvousClient>(*std::move(channels), c.topology().job_id, epoch,
                                               nullptr, Env("RINGMASTER_RENDEZVOUS_TOKEN"));
  g.prefix = prefix;
  g.hostname = Env("RINGMASTER_ADDRESS");  // the daemon's data-plane address (other hosts reach it)
  return CreateGlooBackend(std::move(g));
}

// Every rank allgathers `bytes` (float32 rows of 1 KiB) per iteration, one at a time, through
// Ringmaster and through raw Gloo; rank 0 prints each one's median (the slowest rank's).
int Allgather(Client& c, int64_t bytes) {
  const int warmup = absl::GetFlag(FLAGS_warmup), steps = absl::GetFlag(FLAGS_steps);
  const int64_t rows = std::max<int64_t>(1, bytes / 1024);
  std::vector<float> mine(rows * 256, static_cast<float>(c.rank()));
  std::vector<double> ours;
  for (int step = 0; step < warmup + steps; ++step) {
    c.Barrier().IgnoreError();
    const absl::Time start = absl::Now();
    auto h = c.AllgatherAsync("bench.allgather", mine.data(), DataType::kFloat32, {rows, 256});
    absl::Status s = h.ok() ? c.Wait(*h) : h.status();
    absl::StatusOr<AllgatherOutput> out = s.ok() ? c.TakeAllgather(*h) : s;
    if (!out.ok() || out->shape[0] != rows * c.size()) {
      std::fprintf(stderr, "allgather: %s\n", out.status().ToString().c_str());
      return 1;
    }
    if (step >= warmup) ours.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  absl::StatusOr<double> ours_max = MaxOverRanks(c, Median(ours), "bench.max.allgather");
  absl::StatusOr<std::unique_ptr<Backend>> gloo = RawGloo(c, "bench-gloo-allgather/");
  if (!ours_max.ok() || !gloo.ok()) {
    std::fprintf(stderr, "raw gloo: %s\n", gloo.status().ToString().c_str());
    return 1;
  }
  std::vector<float> all(mine.size() * c.size());
  const std::vector<int64_t> parts(c.size(), static_cast<int64_t>(mine.size() * sizeof(float)));
  std::vector<double> raw;
  for (int step = 0; step < warmup + steps; ++step) {
    (*gloo)->Barrier().IgnoreError();
    const absl::Time start = absl::Now();
    if (absl::Status s = (*gloo)->Allgatherv(mine.data(), all.data(), parts); !s.ok()) {
      std::fprintf(stderr, "raw gloo allgather: %s\n", s.ToString().c_str());
      return 1;
    }
    if (step >= warmup) raw.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  absl::StatusOr<double> raw_max = MaxOverRanks(c, Median(raw), "bench.max.allgather.raw");
  if (!raw_max.ok()) return 1;
  if (c.rank() == 0) {
    for (const auto& [system, t] : {std::pair<const char*, double>{"raw-gloo-allgather", *raw_max},
                                    {"ringmaster-allgather", *ours_max}}) {
      if (absl::GetFlag(FLAGS_json)) {
        std::printf(
            "{\"system\":\"%s\",\"bench\":\"allgather\",\"np\":%d,\"bytes_per_rank\":%" PRId64
            ",\"time_s_median\":%.6f}\n",
            system, c.size(), static_cast<int64_t>(rows * 1024), t);
      } else {
        std::printf("%-20s allgather np=%d bytes/rank=%" PRId64 "  median=%.3f ms\n", system,
                    c.size(), static_cast<int64_t>(rows * 1024), t * 1000);
      }
    }
  }
  c.Shutdown();
  return 0;
}

int Main() {
  if (const int n = absl::GetFlag(FLAGS_latency_iterations); n > 0) {
    auto connected = Client::Connect();
    if (!connected.ok()) {
      std::fprintf(stderr, "ringmaster-bench: %s\n", connected.status().ToString().c_str());
      return 1;
    }
    return Latency(**connected, n);
  }
  if (const int64_t bytes = absl::GetFlag(FLAGS_allgather_bytes); bytes > 0) {
    auto connected = Client::Connect();
    if (!connected.ok()) {
      std::fprintf(stderr, "ringmaster-bench: %s\n", connected.status().ToString().c_str());
      return 1;
    }
    return Allgather(**connected, bytes);
  }
  absl::StatusOr<ModelProfile> profile = LoadProfile(absl::GetFlag(FLAGS_profile));
  if (!profile.ok()) {
    std::fprintf(stderr, "ringmaster-bench: %s\n", profile.status().ToString().c_str());
    return 2;
  }
  auto connected = Client::Connect();
  if (!connected.ok()) {
    std::fprintf(stderr, "ringmaster-bench: %s\n", connected.status().ToString().c_str());
    return 1;
  }
  Client& c = **connected;
  const int np = c.size();
  // Gradients live in the arena, back to back in backward order, as views into one buffer (as DDP's
  // gradient_as_bucket_view does), so a fused response is already contiguous: no pack, no unpack.
  int64_t total = 0;
  for (const auto& t : profile->tensors) total += t.Elements();
  float* flat_grads = static_cast<float*>(c.Allocate(total * sizeof(float)));
  if (flat_grads == nullptr) {
    std::fprintf(stderr, "ringmaster-bench: the worker's arena is too small (--arena-mb)\n");
    return 1;
  }
  std::fill(flat_grads, flat_grads + total, 1.0f);
  std::vector<float*> grads;
  std::vector<std::vector<int64_t>> shapes;
  int64_t at = 0;
  for (const auto& t : profile->tensors) {
    grads.push_back(flat_grads + at);
    shapes.push_back(t.shape);
    at += t.Elements();
  }
  const int warmup = absl::GetFlag(FLAGS_warmup), steps = absl::GetFlag(FLAGS_steps);
  const ReduceOp op = absl::GetFlag(FLAGS_op) == "average" ? ReduceOp::kAverage : ReduceOp::kSum;
  std::vector<double> times;
  for (int step = 0; step < warmup + steps; ++step) {
    if (absl::Status s = c.Barrier(); !s.ok()) {
      std::fprintf(stderr, "barrier: %s\n", s.ToString().c_str());
      return 1;
    }
    const absl::Time start = absl::Now();
    std::vector<Handle> handles;
    for (size_t i = 0; i < grads.size(); ++i) {
      auto h =
          c.AllreduceAsync(profile->tensors[i].name, grads[i], DataType::kFloat32, shapes[i], op);
      if (!h.ok()) {
        std::fprintf(stderr, "enqueue: %s\n", h.status().ToString().c_str());
        return 1;
      }
      handles.push_back(*h);
    }
    for (Handle h : handles) {
      if (absl::Status s = c.Wait(h); !s.ok()) {
        std::fprintf(stderr, "allreduce: %s\n", s.ToString().c_str());
        return 1;
      }
    }
    if (step >= warmup) times.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  if (const int last = absl::GetFlag(FLAGS_measure_last);
      last > 0 && static_cast<size_t>(last) < times.size()) {
    times.erase(times.begin(), times.end() - last);
  }
  absl::StatusOr<double> ours = MaxOverRanks(c, Median(times), "bench.max.ours");
  if (!ours.ok()) return 1;

  // The memory-bandwidth floor: one memcpy of the step's bytes, on every rank at once (as the ranks
  // share the host's memory bandwidth during a collective).
  double floor = 0;
  {
    std::vector<float> from(total, 1.0f), to(total, 0.0f);
    std::vector<double> copies;
    for (int step = 0; step < warmup + steps; ++step) {
      c.Barrier().IgnoreError();
      const absl::Time start = absl::Now();
      std::memcpy(to.data(), from.data(), total * sizeof(float));
      if (step >= warmup) copies.push_back(absl::ToDoubleSeconds(absl::Now() - start));
    }
    absl::StatusOr<double> slowest = MaxOverRanks(c, Median(copies), "bench.max.memcpy");
    if (!slowest.ok()) return 1;
    floor = *slowest;
  }

  double baseline = 0;
  if (absl::GetFlag(FLAGS_baseline)) {
    absl::StatusOr<std::unique_ptr<Backend>> gloo = RawGloo(c, "bench-gloo/");
    if (!gloo.ok()) {
      std::fprintf(stderr, "raw gloo: %s\n", gloo.status().ToString().c_str());
      return 1;
    }
    std::vector<float> flat(profile->bytes_fp32 / 4, 1.0f);
    std::vector<double> raw;
    for (int step = 0; step < warmup + steps; ++step) {
      (*gloo)->Barrier().IgnoreError();
      const absl::Time start = absl::Now();
      if (absl::Status s =
              (*gloo)->Allreduce(flat.data(), flat.size(), DataType::kFloat32, ReduceOp::kSum);
          !s.ok()) {
        std::fprintf(stderr, "raw gloo allreduce: %s\n", s.ToString().c_str());
        return 1;
      }
      if (step >= warmup) raw.push_back(absl::ToDoubleSeconds(absl::Now() - start));
    }
    absl::StatusOr<double> slowest = MaxOverRanks(c, Median(raw), "bench.max.raw");
    if (!slowest.ok()) return 1;
    baseline = *slowest;
  }
  if (c.rank() == 0) {
    if (baseline > 0) Print("raw-gloo-one-buffer", *profile, np, 1, baseline, 0);
    Print("memcpy-floor", *profile, np, 1, floor, 0);
    Print(op == ReduceOp::kSum ? "ringmaster" : "ringmaster-average", *profile, np,
          static_cast<int>(grads.size()), *ours, baseline);
  }
  c.Shutdown();
  return 0;
}

}  // namespace
}  // namespace ringmaster

int main(int argc, char** argv) {
  ringmaster::KebabFlags flags(argc, argv);
  absl::ParseCommandLine(flags.argc(), flags.argv());
  return ringmaster::Main();
}
