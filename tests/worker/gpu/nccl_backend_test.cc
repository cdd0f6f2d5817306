// The NCCL backend on real GPUs (ctest label `gpu`; skipped without one). NCCL refuses two ranks on
// one GPU, so the world is every visible GPU, one thread per rank (1 on a single-GPU machine, which
// still runs the whole setup and every collective).
#include "worker/gpu/nccl_backend.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster {
namespace {

class NcclBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const CudaProbe cuda = ProbeCuda();
    if (cuda.devices == 0 && cuda.driver_installed) FAIL() << cuda.problem;
    if (cuda.devices == 0) GTEST_SKIP() << cuda.problem;
    world_ = cuda.devices;
  }

  // Runs `body(rank, backend)` on every rank, each in its own thread on its own GPU.
  template <typename F>
  void OnEveryRank(F body) {
    auto store = KeyValueStore::InMemory();
    std::vector<std::thread> threads;
    for (int r = 0; r < world_; ++r) {
      threads.emplace_back([&, r] {
        NcclBackendOptions o;
        o.rank = r;
        o.size = world_;
        o.device = r;
        o.store = store;
        o.timeout = absl::Seconds(60);
        absl::StatusOr<std::unique_ptr<NcclBackend>> b = CreateNcclBackend(o);
        ASSERT_TRUE(b.ok()) << b.status();
        body(r, **b);
      });
    }
    for (auto& t : threads) t.join();
  }

  int world_ = 0;
};

TEST_F(NcclBackendTest, AllreduceOfKnownRandomDataSumsAndAverages) {
  constexpr int64_t n = 1 << 20;
  std::vector<std::vector<float>> inputs(world_, std::vector<float>(n));
  std::vector<float> sum(n, 0);
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> small(-100, 100);  // exact in float32
  for (auto& in : inputs) {
    for (int64_t i = 0; i < n; ++i) in[i] = static_cast<float>(small(rng));
  }
  for (int64_t i = 0; i < n; ++i) {
    for (int r = 0; r < world_; ++r) sum[i] += inputs[r][i];
  }
  OnEveryRank([&](int r, NcclBackend& b) {
    float* d = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), n * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d, inputs[r].data(), n * sizeof(float), cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_TRUE(b.Allreduce(d, n, DataType::kFloat32, ReduceOp::kSum).ok());
    std::vector<float> out(n);
    ASSERT_EQ(cudaMemcpy(out.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(out, sum);
    cudaFree(d);
  });
}

TEST_F(NcclBackendTest, BroadcastAllgathervAndBarrier) {
  OnEveryRank([&](int r, NcclBackend& b) {
    // Broadcast 64 bytes from the last rank.
    const int root = world_ - 1;
    std::vector<uint8_t> host(64, static_cast<uint8_t>(r));
    uint8_t* d = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), 64), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d, host.data(), 64, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_TRUE(b.Broadcast(d, 64, root).ok());
    ASSERT_EQ(cudaMemcpy(host.data(), d, 64, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(host, std::vector<uint8_t>(64, static_cast<uint8_t>(root)));
    // Allgatherv: rank k contributes k+1 bytes of value k.
    std::vector<int64_t> bytes;
    int64_t total = 0;
    for (int k = 0; k < world_; ++k) {
      bytes.push_back(k + 1);
      total += k + 1;
    }
    std::vector<uint8_t> mine(r + 1, static_cast<uint8_t>(r));
    uint8_t *in = nullptr, *out = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&in), r + 1), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&out), total), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(in, mine.data(), r + 1, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_TRUE(b.Allgatherv(in, out, bytes).ok());
    std::vector<uint8_t> got(total), want;
    for (int k = 0; k < world_; ++k) want.insert(want.end(), k + 1, static_cast<uint8_t>(k));
    ASSERT_EQ(cudaMemcpy(got.data(), out, total, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(got, want);
    EXPECT_TRUE(b.Barrier().ok());
    cudaFree(d);
    cudaFree(in);
    cudaFree(out);
  });
}

TEST_F(NcclBackendTest, AfterAnAbortEveryCollectiveFailsWithTheReason) {
  OnEveryRank([&](int r, NcclBackend& b) {
    b.Abort("job job-000009 stopped: rank 1 on host-c was lost");
    absl::Status s = b.Barrier();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(s.message()),
                ::testing::HasSubstr("aborted: job job-000009 stopped: rank 1 on host-c was lost"));
  });
}

TEST_F(NcclBackendTest, ASetupWhosePeerNeverComesFailsAtItsDeadline) {
  // Rank 0 of 2; rank 1 never starts.
  NcclBackendOptions o;
  o.rank = 0;
  o.size = 2;
  o.store = KeyValueStore::InMemory();
  o.where = "rank 0 (h0, cuda:0)";
  o.timeout = absl::Seconds(2);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<NcclBackend>> b = CreateNcclBackend(o);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(b.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(b.status().message(),
            "NCCL communicator setup on rank 0 (h0, cuda:0) did not complete in 2s (are all 2 "
            "ranks up, and can they reach each other? see NCCL_SOCKET_IFNAME)");
}

TEST_F(NcclBackendTest, TheSetupDeadlineIsMeasuredOnTheInjectedClock) {
  // Rank 0 of 2; rank 1 never starts. An hour's timeout passes when the test moves the clock.
  FakeClock clock;
  NcclBackendOptions o;
  o.rank = 0;
  o.size = 2;
  o.store = KeyValueStore::InMemory();
  o.where = "rank 0 (h0, cuda:0)";
  o.timeout = absl::Hours(1);
  o.clock = &clock;
  std::atomic<bool> returned{false};
  std::thread mover([&] {
    absl::SleepFor(absl::Milliseconds(200));  // the setup is polling by then
    clock.Advance(absl::Minutes(59));
    absl::SleepFor(absl::Milliseconds(200));
    EXPECT_FALSE(returned.load()) << "gave up before its deadline on the injected clock";
    clock.Advance(absl::Minutes(2));
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<NcclBackend>> b = CreateNcclBackend(o);
  returned = true;
  mover.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(b.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(b.status().message(),
            "NCCL communicator setup on rank 0 (h0, cuda:0) did not complete in 1h (are all 2 "
            "ranks up, and can they reach each other? see NCCL_SOCKET_IFNAME)");
}

TEST_F(NcclBackendTest, ACollectiveWhosePeerNeverComesIsAbortedAtItsDeadlineAndReported) {
  if (world_ < 2) GTEST_SKIP() << "needs two GPUs (NCCL takes one rank per GPU)";
  auto store = KeyValueStore::InMemory();
  std::vector<std::vector<absl::Status>> reported(2);
  std::vector<std::unique_ptr<NcclBackend>> backends(2);
  std::vector<std::thread> setup;
  for (int r = 0; r < 2; ++r) {
    setup.emplace_back([&, r] {
      NcclBackendOptions o;
      o.rank = r;
      o.size = 2;
      o.device = r;
      o.store = store;
      o.where = absl::StrCat("rank ", r, " (h0, cuda:", r, ")");
      o.timeout = absl::Seconds(2);
      o.on_fail = [&, r](const absl::Status& s) { reported[r].push_back(s); };
      absl::StatusOr<std::unique_ptr<NcclBackend>> b = CreateNcclBackend(o);
      ASSERT_TRUE(b.ok()) << b.status();
      backends[r] = *std::move(b);
    });
  }
  for (auto& t : setup) t.join();
  ASSERT_TRUE(backends[0] != nullptr && backends[1] != nullptr);
  // Only rank 0 calls the allreduce: it is stuck waiting for rank 1, until the watchdog's deadline.
  cudaSetDevice(0);
  void* data = nullptr;
  ASSERT_EQ(cudaMalloc(&data, 1024), cudaSuccess);
  const absl::Time start = absl::Now();
  absl::Status s = backends[0]->Allreduce(data, 256, DataType::kFloat32, ReduceOp::kSum);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s.message(),
            "NCCL allreduce on rank 0 (h0, cuda:0) did not complete in 2s (a peer is stuck or "
            "gone); the communicator was aborted");
  ASSERT_EQ(reported[0].size(), 1u);  // the daemon reports it to the coordinator
  EXPECT_EQ(reported[0][0], s);
  EXPECT_TRUE(reported[1].empty());
  // Every later call fails with the cause; the other rank is aborted as the job stops.
  EXPECT_EQ(backends[0]->Barrier().code(), absl::StatusCode::kFailedPrecondition);
  backends[1]->Abort("job stopped");
  EXPECT_TRUE(reported[1].empty());  // told to: nothing to report
  backends.clear();
  cudaFree(data);
}

TEST_F(NcclBackendTest, AMissingDeviceIsRefusedAtCreation) {
  NcclBackendOptions o;
  o.device = world_ + 3;
  o.store = KeyValueStore::InMemory();
  absl::StatusOr<std::unique_ptr<NcclBackend>> b = CreateNcclBackend(o);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(b.status().message()), ::testing::HasSubstr("does not exist"));
}

}  // namespace
}  // namespace ringmaster
