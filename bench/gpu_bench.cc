// ringmaster-gpu-bench: the GPU data plane's pieces against their yardsticks, on every visible GPU
// (one rank per GPU, a thread each; NCCL refuses two ranks on one GPU):
//   fused   a model profile's gradients, lying apart in device memory, packed into an aligned
//   fusion
//           buffer by the pack kernel, allreduced by the NCCL backend (event-polled, under the
//           watchdog), and unpacked — against a raw ncclAllReduce of one buffer of the same bytes;
//   pack    pack + unpack kernel bandwidth against cudaMemcpyAsync device-to-device of the same
//   bytes.
// Prints one JSON object per line (rank 0), then nothing else; scripts/gpu-check.sh tabulates them.
// With one GPU the NCCL comparison means little: a one-rank in-place ncclAllReduce moves no data,
// so "raw" is a launch and the fused step is mostly pack + unpack (gpu-check.sh says so). The whole
// path (client -> daemon through CUDA IPC) is measured by gpu_collectives_check under
// `ringmaster local --gpus` (tests/worker/gpu/gpu_whole_path.sh).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "bench/profile.h"
#include "common/flags.h"
#include "worker/gpu/fusion_kernels.h"
#include "worker/gpu/fusion_layout.h"
#include "worker/gpu/nccl_backend.h"

ABSL_FLAG(std::string, profile, "bench/profiles/resnet50.json", "model profile JSON");
ABSL_FLAG(int, steps, 30, "measured steps");
ABSL_FLAG(int, warmup, 5, "unmeasured steps first");
ABSL_FLAG(int, large_mib, 256,
          "also time a raw ncclAllReduce of one buffer this large (the whole path's large-message "
          "yardstick, tests/worker/gpu/gpu_collectives_check); 0: skip");

namespace ringmaster {
namespace {

#define CHECK_CUDA(call)                                               \
  do {                                                                 \
    cudaError_t e_ = (call);                                           \
    if (e_ != cudaSuccess) {                                           \
      std::fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                    \
    }                                                                  \
  } while (0)

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct RankResult {
  double fused_s = 0, raw_s = 0, pack_s = 0, memcpy_s = 0, raw_large_s = 0;
};

RankResult RunRank(int rank, int world, const ModelProfile& p, std::shared_ptr<KeyValueStore> store,
                   int warmup, int steps) {
  CHECK_CUDA(cudaSetDevice(rank));
  NcclBackendOptions o;
  o.rank = rank;
  o.size = world;
  o.device = rank;
  o.store = store;
  o.timeout = absl::Seconds(60);
  auto backend = CreateNcclBackend(o);
  if (!backend.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, backend.status().ToString().c_str());
    std::exit(1);
  }
  NcclBackend& b = **backend;
  cudaStream_t stream = static_cast<cudaStream_t>(b.stream());
  // The gradients, each in its own allocation (apart, as a framework's are).
  std::vector<int64_t> bytes;
  std::vector<void*> grads;
  for (const auto& t : p.tensors) {
    const int64_t n = 4 * t.Elements();
    void* g = nullptr;
    CHECK_CUDA(cudaMalloc(&g, n));
    CHECK_CUDA(cudaMemset(g, 0, n));
    grads.push_back(g);
    bytes.push_back(n);
  }
  absl::StatusOr<FusionLayout> layout = PlanFusion(bytes, 4);
  uint8_t* fusion = nullptr;
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&fusion), layout->total_bytes));
  std::vector<DeviceSegment> pack, unpack;
  for (size_t i = 0; i < grads.size(); ++i) {
    pack.push_back({grads[i], fusion + layout->offsets[i], bytes[i] / 4});
    unpack.push_back({fusion + layout->offsets[i], grads[i], bytes[i] / 4});
  }
  auto fused_step = [&] {
    if (!ScaledCopy(pack, DataType::kFloat32, 1.0, 1, stream).ok() ||
        !b.Allreduce(fusion, layout->Elements(4), DataType::kFloat32, ReduceOp::kSum).ok() ||
        !ScaledCopy(unpack, DataType::kFloat32, 1.0, 1, stream).ok()) {
      std::fprintf(stderr, "rank %d: fused step failed\n", rank);
      std::exit(1);
    }
    CHECK_CUDA(cudaStreamSynchronize(stream));
  };
  // Raw NCCL on one buffer of the model's bytes, its own communicator and stream.
  ncclUniqueId id;
  if (rank == 0) {
    ncclGetUniqueId(&id);
    store->Set("raw/id", std::string(reinterpret_cast<char*>(&id), sizeof(id))).IgnoreError();
  } else {
    auto v = store->Wait({"raw/id"}, absl::Seconds(60));
    std::memcpy(&id, (*v)[0].data(), sizeof(id));
  }
  ncclComm_t raw;
  if (ncclCommInitRank(&raw, world, id, rank) != ncclSuccess) std::exit(1);
  cudaStream_t raw_stream;
  CHECK_CUDA(cudaStreamCreate(&raw_stream));
  void* flat = nullptr;
  CHECK_CUDA(cudaMalloc(&flat, p.bytes_fp32));
  auto raw_step = [&] {
    ncclAllReduce(flat, flat, p.bytes_fp32 / 4, ncclFloat32, ncclSum, raw, raw_stream);
    CHECK_CUDA(cudaStreamSynchronize(raw_stream));
  };
  RankResult out;
  std::vector<double> fused, rawt, packt, copyt;
  for (int i = 0; i < warmup + steps; ++i) {
    b.Barrier().IgnoreError();
    absl::Time t = absl::Now();
    fused_step();
    if (i >= warmup) fused.push_back(absl::ToDoubleSeconds(absl::Now() - t));
    b.Barrier().IgnoreError();
    t = absl::Now();
    raw_step();
    if (i >= warmup) rawt.push_back(absl::ToDoubleSeconds(absl::Now() - t));
  }
  // Pack + unpack against two device-to-device copies of the same bytes, timed by events.
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  for (int i = 0; i < warmup + steps; ++i) {
    CHECK_CUDA(cudaEventRecord(e0, stream));
    ScaledCopy(pack, DataType::kFloat32, 1.0, 1, stream).IgnoreError();
    ScaledCopy(unpack, DataType::kFloat32, 1.0, 1, stream).IgnoreError();
    CHECK_CUDA(cudaEventRecord(e1, stream));
    CHECK_CUDA(cudaEventSynchronize(e1));
    float ms;
    CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    if (i >= warmup) packt.push_back(ms / 1e3);
    CHECK_CUDA(cudaEventRecord(e0, stream));
    CHECK_CUDA(cudaMemcpyAsync(fusion, flat, p.bytes_fp32, cudaMemcpyDeviceToDevice, stream));
    CHECK_CUDA(cudaMemcpyAsync(flat, fusion, p.bytes_fp32, cudaMemcpyDeviceToDevice, stream));
    CHECK_CUDA(cudaEventRecord(e1, stream));
    CHECK_CUDA(cudaEventSynchronize(e1));
    CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    if (i >= warmup) copyt.push_back(ms / 1e3);
  }
  out.fused_s = Median(fused);
  out.raw_s = Median(rawt);
  out.pack_s = Median(packt);
  out.memcpy_s = Median(copyt);
  // Raw NCCL on one large buffer: bus bandwidth, where latency no longer matters.
  const size_t large = static_cast<size_t>(absl::GetFlag(FLAGS_large_mib)) << 20;
  if (large > 0) {
    void* big = nullptr;
    CHECK_CUDA(cudaMalloc(&big, large));
    CHECK_CUDA(cudaMemset(big, 0, large));
    std::vector<double> larget;
    for (int i = 0; i < warmup + steps; ++i) {
      b.Barrier().IgnoreError();
      const absl::Time t = absl::Now();
      ncclAllReduce(big, big, large / 4, ncclFloat32, ncclSum, raw, raw_stream);
      CHECK_CUDA(cudaStreamSynchronize(raw_stream));
      if (i >= warmup) larget.push_back(absl::ToDoubleSeconds(absl::Now() - t));
    }
    out.raw_large_s = Median(larget);
    cudaFree(big);
  }
  ncclCommDestroy(raw);
  for (void* g : grads) cudaFree(g);
  cudaFree(fusion);
  cudaFree(flat);
  return out;
}

int Main() {
  absl::StatusOr<ModelProfile> profile = LoadProfile(absl::GetFlag(FLAGS_profile));
  if (!profile.ok()) {
    std::fprintf(stderr, "%s\n", profile.status().ToString().c_str());
    return 2;
  }
  const CudaProbe cuda = ProbeCuda();
  const int world = cuda.devices;
  if (world == 0) {
    std::fprintf(stderr, "ringmaster-gpu-bench: %s\n", cuda.problem.c_str());
    return cuda.driver_installed ? 1 : 77;  // a driver but no device is a failure, not a skip
  }
  auto store = KeyValueStore::InMemory();
  std::vector<RankResult> results(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      results[r] = RunRank(r, world, *profile, store, absl::GetFlag(FLAGS_warmup),
                           absl::GetFlag(FLAGS_steps));
    });
  }
  for (auto& t : threads) t.join();
  double fused = 0, raw = 0;
  for (const RankResult& r : results) {
    fused = std::max(fused, r.fused_s);  // a step ends when the slowest rank ends
    raw = std::max(raw, r.raw_s);
  }
  // A rate or ratio of a time too short to measure is 0 (JSON has no infinity).
  auto per = [](double x, double seconds) { return seconds > 0 ? x / seconds : 0.0; };
  const double bytes = static_cast<double>(profile->bytes_fp32);
  const double factor = world > 1 ? 2.0 * (world - 1) / world : 1.0;  // bus bandwidth (algbw at 1)
  std::printf(
      "{\"bench\":\"fused_allreduce\",\"profile\":\"%s\",\"gpus\":%d,\"tensors\":%zu,"
      "\"bytes\":%.0f,\"fused_ms\":%.4f,\"raw_nccl_ms\":%.4f,\"fused_busbw_gbs\":%.2f,"
      "\"raw_busbw_gbs\":%.2f,\"ratio\":%.4f}\n",
      profile->model.c_str(), world, profile->tensors.size(), bytes, fused * 1e3, raw * 1e3,
      per(factor * bytes, fused) / 1e9, per(factor * bytes, raw) / 1e9, per(raw, fused));
  double raw_large = 0;
  for (const RankResult& r : results) raw_large = std::max(raw_large, r.raw_large_s);
  if (raw_large > 0) {
    const double large = static_cast<double>(int64_t{absl::GetFlag(FLAGS_large_mib)} << 20);
    std::printf(
        "{\"bench\":\"raw_nccl_large\",\"gpus\":%d,\"bytes\":%.0f,\"raw_nccl_ms\":%.4f,"
        "\"raw_busbw_gbs\":%.2f}\n",
        world, large, raw_large * 1e3, factor * large / raw_large / 1e9);
  }
  const RankResult& r0 = results[0];
  std::printf(
      "{\"bench\":\"pack_unpack\",\"profile\":\"%s\",\"bytes\":%.0f,\"pack_unpack_ms\":%.4f,"
      "\"memcpy_d2d_ms\":%.4f,\"pack_unpack_gbs\":%.1f,\"memcpy_d2d_gbs\":%.1f,"
      "\"ratio\":%.4f}\n",
      profile->model.c_str(), bytes, r0.pack_s * 1e3, r0.memcpy_s * 1e3,
      per(2 * bytes, r0.pack_s) / 1e9, per(2 * bytes, r0.memcpy_s) / 1e9,
      per(r0.memcpy_s, r0.pack_s));
  return 0;
}

}  // namespace
}  // namespace ringmaster

int main(int argc, char** argv) {
  ringmaster::KebabFlags flags(argc, argv);
  absl::ParseCommandLine(flags.argc(), flags.argv());
  return ringmaster::Main();
}
