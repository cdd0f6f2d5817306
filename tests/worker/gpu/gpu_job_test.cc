// The GPU executor's fused allreduce (ctest label `gpu` on real GPUs; `gpu_job_fake_cuda` over the
// fake CUDA runtime and NCCL). Needs two devices: one rank per device, one thread per rank.
#include "worker/gpu/gpu_job.h"

#include <cuda_runtime_api.h>

#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "worker/gpu/nccl_backend.h"

namespace ringmaster {
namespace {

// Two ranks reduce the same response (tensors a and b) whose tensors lie differently in their
// arenas: on rank 0 back to back (b right after a), on rank 1 apart. The ranks must reduce the same
// elements however each one reaches them: a rank that took the adjacent tensors for one buffer
// while the other packed them (with the fusion buffer's padding) would sum a's elements with b's.
TEST(GpuJobTest, TensorsAdjacentOnOneRankAndApartOnAnotherReduceExactly) {
  const CudaProbe cuda = ProbeCuda();
  if (cuda.devices < 2) GTEST_SKIP() << "needs two GPUs: " << cuda.problem;
  constexpr int64_t kA = 5, kB = 3;  // odd sizes: the fusion buffer pads them
  auto store = KeyValueStore::InMemory();
  std::vector<std::vector<float>> results(2);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      GpuJobOptions o;
      o.device = rank;
      o.rank = rank;
      o.size = 2;
      o.arena_bytes = 1 << 20;
      o.make_backend = [&, rank](std::shared_ptr<std::atomic<bool>> cancelled) {
        NcclBackendOptions n;
        n.rank = rank;
        n.size = 2;
        n.device = rank;
        n.store = store;
        n.timeout = absl::Seconds(60);
        n.cancelled = std::move(cancelled);
        return CreateNcclBackend(std::move(n));
      };
      absl::StatusOr<std::unique_ptr<GpuJob>> job = GpuJob::Create(std::move(o));
      ASSERT_TRUE(job.ok()) << job.status();
      ASSERT_TRUE((*job)->Setup().ok());
      const int64_t a_at = 0;
      const int64_t b_at = rank == 0 ? kA * 4 : 4096;
      std::vector<float> a(kA), b(kB);
      for (int64_t i = 0; i < kA; ++i) a[i] = static_cast<float>(1 + i + 10 * rank);
      for (int64_t i = 0; i < kB; ++i) b[i] = static_cast<float>(100 + i + 1000 * rank);
      ASSERT_EQ(cudaSetDevice(rank), cudaSuccess);
      uint8_t* arena = (*job)->arena();
      ASSERT_EQ(cudaMemcpy(arena + a_at, a.data(), kA * 4, cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(arena + b_at, b.data(), kB * 4, cudaMemcpyHostToDevice), cudaSuccess);
      absl::StatusOr<int32_t> done = (*job)->Allreduce(
          {{a_at, kA, 0}, {b_at, kB, 0}}, DataType::kFloat32, ReduceOp::kSum, 1.0, 1.0);
      ASSERT_TRUE(done.ok()) << done.status();
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<float> out(kA + kB);
      ASSERT_EQ(cudaMemcpy(out.data(), arena + a_at, kA * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(out.data() + kA, arena + b_at, kB * 4, cudaMemcpyDeviceToHost),
                cudaSuccess);
      results[rank] = out;
    });
  }
  for (std::thread& t : ranks) t.join();
  // a: (1 + i) + (11 + i); b: (100 + i) + (1100 + i).
  const std::vector<float> want = {12, 14, 16, 18, 20, 1200, 1202, 1204};
  EXPECT_EQ(results[0], want);
  EXPECT_EQ(results[1], want);
}

}  // namespace
}  // namespace ringmaster
