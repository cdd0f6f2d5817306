// Run as every rank of a GPU job (`ringmaster local --np N --gpus -- gpu_collectives_check`): the
// whole GPU path — client -> daemon (CUDA IPC arena, interprocess events) -> NCCL — checked against
// exact expected values (also across streams and threads), then timed on the ResNet-50 profile
// and on 256 MiB tensors. Exits 0 when every check passes; rank 0 prints a JSON line per timing.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/profile.h"
#include "ringmaster/client.h"

namespace {

int failures = 0;

#define CHECK(cond, ...)                                       \
  do {                                                         \
    if (!(cond)) {                                             \
      std::printf("rank %d: check failed: %s: ", rank, #cond); \
      std::printf(__VA_ARGS__);                                \
      std::printf("\n");                                       \
      ++failures;                                              \
    }                                                          \
  } while (0)

int rank = 0;

template <typename T>
std::vector<T> Down(const void* device, size_t n) {
  std::vector<T> v(n);
  cudaDeviceSynchronize();
  cudaMemcpy(v.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost);
  return v;
}

template <typename T>
void Up(void* device, const std::vector<T>& v) {
  cudaMemcpy(device, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
}

}  // namespace

int main(int argc, char** argv) {
  auto connected = ringmaster::Client::Connect();
  if (!connected.ok()) {
    std::printf("connect: %s\n", connected.status().ToString().c_str());
    return 1;
  }
  ringmaster::Client& c = **connected;
  rank = c.rank();
  const int n = c.size();
  const int device = c.topology().device;
  if (device < 0) {
    std::printf("rank %d: not a GPU slot (run with ringmaster local --gpus)\n", rank);
    return 1;
  }
  cudaSetDevice(device);
  using ringmaster::DataType;
  using ringmaster::ReduceOp;

  // 1. Allreduce sum of exact integers in float32, in the arena (zero copy), and average of int32
  //    staged from memory outside the arena.
  const size_t count = 100000;
  float* a = static_cast<float*>(c.Allocate(count * sizeof(float)));
  std::vector<float> av(count);
  for (size_t i = 0; i < count; ++i) av[i] = static_cast<float>((rank + 1) * (i % 97));
  Up(a, av);
  int32_t* b = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&b), 1000 * sizeof(int32_t));
  std::vector<int32_t> bv(1000);
  for (size_t i = 0; i < bv.size(); ++i) bv[i] = static_cast<int32_t>(rank * 10 + i);
  Up(b, bv);
  auto ha =
      c.AllreduceAsync("a", a, DataType::kFloat32, {static_cast<int64_t>(count)}, ReduceOp::kSum);
  auto hb = c.AllreduceAsync("b", b, DataType::kInt32, {1000}, ReduceOp::kAverage);
  CHECK(ha.ok() && hb.ok(), "enqueue");
  CHECK(c.Wait(*ha).ok() && c.Wait(*hb).ok(), "wait");
  const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
  std::vector<float> ar = Down<float>(a, count);
  for (size_t i = 0; i < count; ++i) {
    if (ar[i] != ranks_sum * static_cast<float>(i % 97)) {
      CHECK(false, "a[%zu] = %g, want %g", i, ar[i], ranks_sum * static_cast<float>(i % 97));
      break;
    }
  }
  std::vector<int32_t> br = Down<int32_t>(b, 1000);
  for (size_t i = 0; i < br.size(); ++i) {
    // sum over ranks of (r*10 + i), divided by n, truncating
    const int32_t want =
        static_cast<int32_t>((10 * (n * (n - 1) / 2) + n * static_cast<int>(i)) / n);
    if (br[i] != want) {
      CHECK(false, "b[%zu] = %d, want %d", i, br[i], want);
      break;
    }
  }

  // 2. Grouped allreduce of tensors apart in the arena (the pack/unpack path), with prescale and
  //    postscale.
  float* g1 = static_cast<float*>(c.Allocate(333 * sizeof(float)));
  void* gap = c.Allocate(4096);
  float* g2 = static_cast<float*>(c.Allocate(777 * sizeof(float)));
  Up(g1, std::vector<float>(333, 1.0f + rank));
  Up(g2, std::vector<float>(777, 2.0f));
  auto hg = c.GroupedAllreduceAsync({"g1", "g2"}, {g1, g2}, DataType::kFloat32, {{333}, {777}},
                                    ReduceOp::kSum, 2.0, 0.5);
  CHECK(hg.ok(), "grouped enqueue");
  for (auto h : *hg) CHECK(c.Wait(h).ok(), "grouped wait");
  const std::vector<float> g1r = Down<float>(g1, 333), g2r = Down<float>(g2, 777);
  const auto g1_bad = std::find_if(g1r.begin(), g1r.end(), [&](float v) { return v != ranks_sum; });
  const auto g2_bad = std::find_if(g2r.begin(), g2r.end(), [&](float v) { return v != 2.0f * n; });
  CHECK(g1_bad == g1r.end(), "g1[%td] = %g, want %g", g1_bad - g1r.begin(),
        g1_bad == g1r.end() ? 0.0f : *g1_bad, ranks_sum);
  CHECK(g2_bad == g2r.end(), "g2[%td] = %g, want %g", g2_bad - g2r.begin(),
        g2_bad == g2r.end() ? 0.0f : *g2_bad, 2.0f * n);
  c.Free(gap);

  // 3. Broadcast from the last rank.
  float* w = static_cast<float*>(c.Allocate(64 * sizeof(float)));
  Up(w, std::vector<float>(64, static_cast<float>(rank)));
  auto hw = c.BroadcastAsync("w", w, DataType::kFloat32, {64}, n - 1);
  CHECK(hw.ok() && c.Wait(*hw).ok(), "broadcast");
  CHECK(Down<float>(w, 64)[63] == static_cast<float>(n - 1), "broadcast value");

  // 4. Allgather with a different first dimension per rank.
  float* part = static_cast<float*>(c.Allocate((rank + 1) * 2 * sizeof(float)));
  Up(part, std::vector<float>((rank + 1) * 2, static_cast<float>(rank)));
  auto hp = c.AllgatherAsync("part", part, DataType::kFloat32, {rank + 1, 2});
  CHECK(hp.ok() && c.Wait(*hp).ok(), "allgather");
  absl::StatusOr<ringmaster::AllgatherOutput> out = c.TakeAllgather(*hp);
  CHECK(out.ok(), "allgather output");
  if (out.ok()) {
    CHECK(out->shape.size() == 2 && out->shape[0] == n * (n + 1) / 2, "allgather shape");
    const float* f = reinterpret_cast<const float*>(out->data.data());
    int at = 0;
    for (int r = 0; r < n; ++r) {
      for (int k = 0; k < (r + 1) * 2; ++k, ++at) {
        if (f[at] != static_cast<float>(r)) {
          CHECK(false, "allgather[%d] = %g, want %d", at, f[at], r);
          r = n;
          break;
        }
      }
    }
  }

  // 5. Streams: tensors outside the arena (staged), submitted by one thread on its stream (kept
  //    busy by a large copy queued first), waited for by another thread whose stream then reads
  //    them with no device-wide synchronisation: only the client's ordering makes that stream see
  //    the results. Twenty rounds, so staged memory and events are reused.
  {
    cudaStream_t produce = nullptr, consume = nullptr;
    cudaStreamCreateWithFlags(&produce, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&consume, cudaStreamNonBlocking);
    constexpr int kTensors = 24;
    constexpr int64_t kCount = 4099;
    std::vector<float*> xs(kTensors, nullptr);
    for (float*& x : xs) cudaMalloc(reinterpret_cast<void**>(&x), kCount * sizeof(float));
    const size_t busy = size_t{64} << 20;
    void* busy_from = nullptr;
    void* busy_to = nullptr;
    cudaMalloc(&busy_from, busy);
    cudaMalloc(&busy_to, busy);
    std::vector<float> got(kCount);
    for (int round = 0; round < 20 && failures == 0; ++round) {
      std::vector<ringmaster::Handle> handles(kTensors, 0);
      std::vector<std::vector<float>> inputs(kTensors);
      std::thread producer([&] {
        cudaSetDevice(device);
        c.SetCudaStream(produce);
        cudaMemcpyAsync(busy_to, busy_from, busy, cudaMemcpyDeviceToDevice, produce);
        for (int i = 0; i < kTensors; ++i) {
          inputs[i].assign(kCount, static_cast<float>(rank + 1 + round + i));
          cudaMemcpyAsync(xs[i], inputs[i].data(), kCount * sizeof(float), cudaMemcpyHostToDevice,
                          produce);
          auto h = c.AllreduceAsync(absl::StrCat("stream.", i), xs[i], DataType::kFloat32, {kCount},
                                    ReduceOp::kSum, 1.0, 2.0);
          CHECK(h.ok(), "stream submit %d", i);
          if (h.ok()) handles[i] = *h;
        }
      });
      producer.join();
      c.SetCudaStream(consume);
      for (int i = 0; i < kTensors; ++i) {
        CHECK(handles[i] != 0 && c.Wait(handles[i]).ok(), "stream wait %d", i);
        cudaMemcpyAsync(got.data(), xs[i], kCount * sizeof(float), cudaMemcpyDeviceToHost, consume);
        cudaStreamSynchronize(consume);
        const float want = 2.0f * (ranks_sum + static_cast<float>(n * (round + i)));
        const auto bad = std::find_if(got.begin(), got.end(), [&](float v) { return v != want; });
        CHECK(bad == got.end(), "round %d, tensor %d: [%td] = %g, want %g", round, i,
              bad - got.begin(), bad == got.end() ? 0.0f : *bad, want);
      }
      c.SetCudaStream(nullptr);
    }
    cudaDeviceSynchronize();
    for (float* x : xs) cudaFree(x);
    cudaFree(busy_from);
    cudaFree(busy_to);
    cudaStreamDestroy(produce);
    cudaStreamDestroy(consume);
  }

  // 6. Timing: the ResNet-50 profile's gradients back to back in the arena, every step enqueued in
  //    backward order, then waited for.
  const char* profile_path = argc > 1 ? argv[1] : "bench/profiles/resnet50.json";
  absl::StatusOr<ringmaster::ModelProfile> profile = ringmaster::LoadProfile(profile_path);
  // RINGMASTER_CHECK_SKIP_TIMING=1 (the fake CUDA runtime's run): the checks only.
  const bool timing = std::getenv("RINGMASTER_CHECK_SKIP_TIMING") == nullptr;
  if (profile.ok() && timing) {
    std::vector<float*> grads;
    std::vector<std::vector<int64_t>> shapes;
    float* flat = static_cast<float*>(c.Allocate(profile->bytes_fp32));
    CHECK(flat != nullptr, "arena too small for the profile");
    int64_t at = 0;
    for (const auto& t : profile->tensors) {
      grads.push_back(flat + at);
      shapes.push_back(t.shape);
      at += t.Elements();
    }
    cudaMemset(flat, 0, profile->bytes_fp32);
    std::vector<double> times;
    for (int step = 0; step < 25 && flat != nullptr; ++step) {
      CHECK(c.Barrier().ok(), "barrier");
      cudaDeviceSynchronize();
      const absl::Time start = absl::Now();
      std::vector<ringmaster::Handle> hs;
      for (size_t i = 0; i < grads.size(); ++i) {
        auto h = c.AllreduceAsync(profile->tensors[i].name, grads[i], DataType::kFloat32, shapes[i],
                                  ReduceOp::kSum);
        if (h.ok()) hs.push_back(*h);
      }
      for (auto h : hs) c.Wait(h).IgnoreError();
      cudaDeviceSynchronize();
      if (step >= 5) times.push_back(absl::ToDoubleSeconds(absl::Now() - start));
    }
    std::sort(times.begin(), times.end());
    if (rank == 0 && !times.empty()) {
      const double median = times[times.size() / 2];
      const double factor = n > 1 ? 2.0 * (n - 1) / n : 1.0;
      std::printf(
          "{\"bench\":\"whole_path\",\"profile\":\"%s\",\"gpus\":%d,\"tensors\":%zu,"
          "\"step_ms\":%.4f,\"busbw_gbs\":%.2f}\n",
          profile->model.c_str(), n, grads.size(), median * 1e3,
          factor * profile->bytes_fp32 / median / 1e9);
    }
  }
  // 7. Timing: bus bandwidth on 256 MiB tensors, two in flight (the next one is submitted before
  //    the previous is waited for, as a backward pass keeps submitting: its negotiation overlaps
  //    the other's allreduce), against ringmaster-gpu-bench's raw ncclAllReduce of 256 MiB. A
  //    smaller arena (--arena-mb) skips it.
  const size_t large = size_t{256} << 20;
  float* big[2] = {timing ? static_cast<float*>(c.Allocate(large)) : nullptr,
                   timing ? static_cast<float*>(c.Allocate(large)) : nullptr};
  if (big[0] != nullptr && big[1] != nullptr) {
    cudaMemset(big[0], 0, large);
    cudaMemset(big[1], 0, large);
    const std::vector<int64_t> shape = {static_cast<int64_t>(large / 4)};
    auto submit = [&](int i) {
      return c.AllreduceAsync(i % 2 == 0 ? "large.a" : "large.b", big[i % 2], DataType::kFloat32,
                              shape, ReduceOp::kSum);
    };
    constexpr int kWarmup = 4, kMeasured = 16;
    CHECK(c.Barrier().ok(), "barrier");
    cudaDeviceSynchronize();
    absl::Time start = absl::Now();
    auto previous = submit(0);
    for (int i = 1; i <= kWarmup + kMeasured && previous.ok(); ++i) {
      if (i == kWarmup) start = absl::Now();
      auto next = i < kWarmup + kMeasured ? submit(i) : absl::StatusOr<ringmaster::Handle>(0);
      CHECK(next.ok() && c.Wait(*previous).ok(), "large allreduce %d", i);
      previous = next;
    }
    cudaDeviceSynchronize();
    const double per_op = absl::ToDoubleSeconds(absl::Now() - start) / kMeasured;
    if (rank == 0) {
      const double factor = n > 1 ? 2.0 * (n - 1) / n : 1.0;
      std::printf(
          "{\"bench\":\"whole_path_large\",\"gpus\":%d,\"bytes\":%zu,\"step_ms\":%.4f,"
          "\"busbw_gbs\":%.2f}\n",
          n, large, per_op * 1e3, factor * static_cast<double>(large) / per_op / 1e9);
    }
  } else if (rank == 0 && timing) {
    std::printf("large-message timing skipped: no 2 x 256 MiB free in the arena\n");
  }
  c.Free(big[0]);
  c.Free(big[1]);
  std::printf("rank %d: %s\n", rank, failures == 0 ? "all checks passed" : "FAILED");
  c.Shutdown();
  return failures == 0 ? 0 : 1;
}
