// The CPU executor over fake communicators that stand for a job of identical ranks (a sum of n
// ranks is n times this rank's values): packing into the fusion buffer only when the tensors are
// not contiguous, averages and scale factors (integers divided exactly), a joined rank's zeros, a
// large allreduce split across the communicators and run on the pool's threads at once, allgather
// outputs placed in the output arena and returned to it on failure, and a communicator that cannot
// be set up.
#include "worker/cpu/cpu_executor.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/cpu/directory_store.h"

namespace ringmaster {
namespace {

using ::testing::ElementsAre;
using ::testing::StartsWith;

struct Calls {
  absl::Mutex mu;
  std::vector<std::string> lines ABSL_GUARDED_BY(mu);
  std::set<std::thread::id> threads ABSL_GUARDED_BY(mu);
  std::atomic<int> concurrent{0};
  std::atomic<int> most_concurrent{0};
  absl::Status fail_allgather_after;  // set: the second allgather fails
  int allgathers = 0;
};

// Communicator `index` of a job of `size` identical ranks.
class FakeBackend : public Backend {
 public:
  FakeBackend(int index, int rank, int size, Calls* calls)
      : index_(index), rank_(rank), size_(size), calls_(*calls) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  absl::Status Allreduce(void* data, int64_t count, DataType dtype, ReduceOp op) override {
    const int now = ++calls_.concurrent;
    int most = calls_.most_concurrent.load();
    while (now > most && !calls_.most_concurrent.compare_exchange_weak(most, now)) {
    }
    // Long enough that parts run at the same time when they can.
    absl::SleepFor(absl::Milliseconds(50));
    if (op == ReduceOp::kSum) {
      if (dtype == DataType::kFloat32) {
        for (int64_t i = 0; i < count; ++i) static_cast<float*>(data)[i] *= size_;
      } else if (dtype == DataType::kInt32) {
        for (int64_t i = 0; i < count; ++i) static_cast<int32_t*>(data)[i] *= size_;
      }
    }  // min, max of identical ranks: unchanged
    --calls_.concurrent;
    Record(absl::StrCat("c", index_, " allreduce ", count, " op=", static_cast<int>(op)));
    return absl::OkStatus();
  }
  absl::Status Broadcast(void* data, int64_t bytes, int root) override {
    if (root != rank_) std::memset(data, 0x7f, bytes);  // the root's bytes
    Record(absl::StrCat("c", index_, " broadcast ", bytes, " root=", root));
    return absl::OkStatus();
  }
  absl::Status Allgatherv(const void* in, void* out, absl::Span<const int64_t> bytes) override {
    auto* o = static_cast<uint8_t*>(out);
    for (int k = 0; k < size_; ++k) {
      if (k == rank_) {
        std::memmove(o, in, bytes[k]);
      } else {
        std::memset(o, 10 + k, bytes[k]);
      }
      o += bytes[k];
    }
    Record(absl::StrCat("c", index_, " allgatherv ", absl::StrJoin(bytes, "/")));
    if (!calls_.fail_allgather_after.ok() && ++calls_.allgathers > 1) {
      return calls_.fail_allgather_after;
    }
    return absl::OkStatus();
  }
  absl::Status Barrier() override {
    Record(absl::StrCat("c", index_, " barrier"));
    return absl::OkStatus();
  }

 private:
  void Record(std::string line) {
    absl::MutexLock lock(&calls_.mu);
    calls_.lines.push_back(std::move(line));
    calls_.threads.insert(std::this_thread::get_id());
  }
  const int index_, rank_, size_;
  Calls& calls_;
};

class CpuExecutorTest : public ::testing::Test {
 protected:
  std::unique_ptr<CpuExecutor> Make(int communicators = 2, int64_t split_bytes = 1 << 20) {
    CpuExecutorOptions o;
    o.rank = 0;
    o.size = 4;
    o.arena = arena_.data();
    o.outputs = &outputs_;
    o.communicators = communicators;
    o.split_bytes = split_bytes;
    o.make_backend = [this](int index) -> absl::StatusOr<std::unique_ptr<Backend>> {
      if (!setup_.ok()) return setup_;
      return std::make_unique<FakeBackend>(index, 0, 4, &calls_);
    };
    auto executor = std::make_unique<CpuExecutor>(std::move(o));
    EXPECT_TRUE(executor->Setup().ok());
    return executor;
  }
  float* Floats(int64_t offset) { return reinterpret_cast<float*>(arena_.data() + offset); }
  std::vector<std::string> Lines() {
    absl::MutexLock lock(&calls_.mu);
    return calls_.lines;
  }
  static Collective Allreduce(std::vector<int64_t> offsets, std::vector<int64_t> sizes,
                              ReduceOp op = ReduceOp::kSum) {
    Collective c;
    c.type = Collective::Type::kAllreduce;
    c.dtype = DataType::kFloat32;
    c.op = op;
    for (int64_t o : offsets) c.tensors.push_back({o, 0, {}});
    c.sizes = std::move(sizes);
    return c;
  }

  std::vector<uint8_t> arena_ = std::vector<uint8_t>(8 << 20);
  ArenaAllocator outputs_{6 << 20, 8 << 20};
  Calls calls_;
  absl::Status setup_;
  ExecutionTrace trace_{/*on=*/true, absl::Now()};
};

std::vector<const char*> Activities(const ExecutionTrace& trace) {
  std::vector<const char*> names;
  for (const auto& [name, end] : trace.ends()) names.push_back(name);
  return names;
}

TEST_F(CpuExecutorTest, ContiguousTensorsAreReducedInPlaceWithoutPacking) {
  auto executor = Make();
  for (int i = 0; i < 6; ++i) Floats(0)[i] = static_cast<float>(i);
  absl::StatusOr<Executed> e = executor->Execute(Allreduce({0, 16}, {4, 2}), trace_);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(std::vector<float>(Floats(0), Floats(0) + 6),
            (std::vector<float>{0, 4, 8, 12, 16, 20}));
  EXPECT_THAT(Lines(), ElementsAre("c0 allreduce 6 op=2"));
  EXPECT_THAT(Activities(trace_), ElementsAre(std::string("GLOO_ALLREDUCE")));
}

TEST_F(CpuExecutorTest, ScatteredTensorsArePackedAndAJoinedRankContributesZeros) {
  auto executor = Make();
  Floats(1024)[0] = 1;
  Floats(1024)[1] = 2;
  Floats(64)[0] = 3;
  // Fused order: the tensor at 1024, one this rank does not have (joined), the one at 64.
  Collective c = Allreduce({1024, -1, 64}, {2, 3, 1}, ReduceOp::kAverage);
  c.prescale = 2;
  c.postscale = 3;
  absl::StatusOr<Executed> e = executor->Execute(c, trace_);
  ASSERT_TRUE(e.ok()) << e.status();
  // x * 2 (prescale), summed over 4 identical ranks, * 3 / 4 (postscale, average) = x * 6.
  EXPECT_EQ(Floats(1024)[0], 6);
  EXPECT_EQ(Floats(1024)[1], 12);
  EXPECT_EQ(Floats(64)[0], 18);
  EXPECT_THAT(Lines(), ElementsAre("c0 allreduce 6 op=2"));  // the average is a sum, then scaled
  EXPECT_THAT(Activities(trace_),
              ElementsAre(std::string("MEMCPY_IN_FUSION_BUFFER"), std::string("GLOO_ALLREDUCE"),
                          std::string("MEMCPY_OUT_FUSION_BUFFER")));
}

// Direct access: a training process's tensors are read and written in its own memory
// (process_vm_readv/writev), fused with one from the arena. The process here is a forked child
// whose buffer sits at the address it has in this process too.
TEST_F(CpuExecutorTest, TensorsOfAProcessWithDirectAccessAreReducedInItsOwnMemory) {
  auto executor = Make();
  static float remote[3];
  int to_child[2], from_child[2];
  ASSERT_EQ(pipe(to_child), 0);
  ASSERT_EQ(pipe(from_child), 0);
  const pid_t child = fork();
  if (child == 0) {
    remote[0] = 1;
    remote[1] = 2;
    remote[2] = 3;
    char go = 0;
    (void)!write(from_child[1], &go, 1);  // its values are in place
    (void)!read(to_child[0], &go, 1);     // the parent has reduced them
    (void)!write(from_child[1], remote, sizeof(remote));
    _exit(0);
  }
  char ready = 0;
  ASSERT_EQ(read(from_child[0], &ready, 1), 1);
  Floats(256)[0] = 10;
  Collective c = Allreduce({-1, 256}, {3, 1});
  c.tensors[0].address = reinterpret_cast<uint64_t>(remote);
  c.tensors[0].pid = child;
  absl::StatusOr<Executed> e = executor->Execute(c, trace_);
  EXPECT_TRUE(e.ok()) << e.status();
  (void)!write(to_child[1], &ready, 1);
  float back[3] = {};
  ASSERT_EQ(read(from_child[0], back, sizeof(back)), static_cast<ssize_t>(sizeof(back)));
  waitpid(child, nullptr, 0);
  // Summed over 4 identical ranks, in the child's memory; the arena's tensor alike.
  EXPECT_EQ(std::vector<float>(back, back + 3), (std::vector<float>{4, 8, 12}));
  EXPECT_EQ(Floats(256)[0], 40);
  EXPECT_THAT(Activities(trace_),
              ElementsAre(std::string("MEMCPY_IN_FUSION_BUFFER"), std::string("GLOO_ALLREDUCE"),
                          std::string("MEMCPY_OUT_FUSION_BUFFER")));
  for (int fd : {to_child[0], to_child[1], from_child[0], from_child[1]}) close(fd);

  // A process that is gone: the collective fails, naming it.
  c.tensors[0].pid = child;  // reaped above
  absl::StatusOr<Executed> gone = executor->Execute(c, trace_);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StartsWith(
      gone.status().message(),
      absl::StrCat("cannot read the training process's tensor (pid ", child, ", 12 bytes at 0x")))
      << gone.status();
}

// Through shared memory, a training process whose tensor cannot be read (gone) fails the
// allreduce on its rank, naming it, and on every other rank of the host, naming that rank: none
// waits for the other. Two forked ranks, each with its executor and the host group.
TEST(CpuExecutorShmTest, ATensorThatCannotBeReadFailsEveryRankOfTheHostNamingIt) {
  char pattern[] = "/tmp/cpu_executor_test.XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const std::string dir = pattern;
  const pid_t gone = fork();  // a process that exits at once: its pid names no process
  if (gone == 0) _exit(0);
  waitpid(gone, nullptr, 0);
  std::vector<pid_t> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    const pid_t child = fork();
    if (child == 0) {
      alarm(60);
      std::vector<uint8_t> arena(1 << 20);
      ArenaAllocator outputs(1 << 19, 1 << 20);
      Calls calls;
      CpuExecutorOptions o;
      o.rank = rank;
      o.size = 2;
      o.arena = arena.data();
      o.outputs = &outputs;
      o.make_backend = [&](int index) -> absl::StatusOr<std::unique_ptr<Backend>> {
        return std::make_unique<FakeBackend>(index, rank, 2, &calls);
      };
      o.make_host_group = [&] {
        ShmGroupOptions g;
        g.rank = rank;
        g.size = 2;
        g.store = std::make_shared<DirectoryStore>(dir);
        g.host = "host-a";
        g.timeout = absl::Seconds(20);
        return ConnectShmGroup(std::move(g));
      };
      CpuExecutor executor(std::move(o));
      std::string out;
      if (absl::Status s = executor.Setup(); !s.ok() || !executor.shares_memory()) {
        out = absl::StrCat("no shared memory: ", s.ToString());
      } else {
        Collective c;
        c.type = Collective::Type::kAllreduce;
        c.dtype = DataType::kFloat32;
        c.op = ReduceOp::kSum;
        c.tensors.push_back({0, 0, {}});
        c.sizes = {4};
        if (rank == 1) {
          static float elsewhere[4];
          c.tensors[0].address = reinterpret_cast<uint64_t>(elsewhere);
          c.tensors[0].pid = gone;
        }
        ExecutionTrace trace(/*on=*/false, absl::Now());
        absl::StatusOr<Executed> e = executor.Execute(c, trace);
        out = absl::StrCat(absl::StatusCodeToString(e.status().code()), ": ", e.status().message());
      }
      std::ofstream(absl::StrCat(dir, "/result.", rank)) << out;
      _exit(0);
    }
    ranks.push_back(child);
  }
  std::vector<std::string> results;
  for (int rank = 0; rank < 2; ++rank) {
    waitpid(ranks[rank], nullptr, 0);
    std::ifstream in(absl::StrCat(dir, "/result.", rank));
    results.push_back(std::string(std::istreambuf_iterator<char>(in), {}));
  }
  std::filesystem::remove_all(dir);
  const std::string why =
      absl::StrCat("cannot read the training process's tensor (pid ", gone, ", 16 bytes at 0x");
  EXPECT_THAT(results[1], StartsWith(absl::StrCat("FAILED_PRECONDITION: ", why))) << results[1];
  EXPECT_THAT(results[0],
              StartsWith(absl::StrCat("FAILED_PRECONDITION: shared-memory allreduce failed on rank "
                                      "1: ",
                                      why)))
      << results[0];
}

TEST_F(CpuExecutorTest, IntegerAveragesAreDividedExactly) {
  auto executor = Make();
  auto* v = reinterpret_cast<int32_t*>(arena_.data());
  v[0] = 7;
  v[1] = -7;
  Collective c = Allreduce({0}, {2}, ReduceOp::kAverage);
  c.dtype = DataType::kInt32;
  ASSERT_TRUE(executor->Execute(c, trace_).ok());
  EXPECT_EQ(v[0], 7);  // 28 / 4
  EXPECT_EQ(v[1], -7);
}

TEST_F(CpuExecutorTest, IntegersAreScaledAsHorovodScalesThemTruncatedTowardZero) {
  auto executor = Make();
  auto* v = reinterpret_cast<int32_t*>(arena_.data());
  v[0] = 7;
  v[1] = -7;
  Collective c = Allreduce({0}, {2}, ReduceOp::kAverage);
  c.dtype = DataType::kInt32;
  c.prescale = 1.5;   // 7 * 1.5 = 10.5 -> 10; -10.5 -> -10
  c.postscale = 0.5;  // summed over 4 identical ranks: 40 * (0.5 / 4) = 5
  ASSERT_TRUE(executor->Execute(c, trace_).ok());
  EXPECT_EQ(v[0], 5);  // 40 * 0.125
  EXPECT_EQ(v[1], -5);
  v[0] = 7;
  v[1] = -7;
  c.prescale = 1;
  c.postscale = 0.5;  // 28 * 0.125 = 3.5 -> 3; -3.5 -> -3
  ASSERT_TRUE(executor->Execute(c, trace_).ok());
  EXPECT_EQ(v[0], 3);
  EXPECT_EQ(v[1], -3);
}

TEST_F(CpuExecutorTest, ALargeAllreduceIsSplitAcrossTheCommunicatorsAndRunsConcurrently) {
  auto executor = Make(/*communicators=*/3, /*split_bytes=*/1024);
  const int64_t n = 300;  // 1200 bytes: split in 3 parts of 100
  for (int64_t i = 0; i < n; ++i) Floats(0)[i] = 1;
  ASSERT_TRUE(executor->Execute(Allreduce({0}, {n}), trace_).ok());
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(Floats(0)[i], 4) << i;
  EXPECT_THAT(Lines(),
              ::testing::UnorderedElementsAre("c0 allreduce 100 op=2", "c1 allreduce 100 op=2",
                                              "c2 allreduce 100 op=2"));
  EXPECT_EQ(calls_.most_concurrent.load(), 3);
  {
    absl::MutexLock lock(&calls_.mu);
    EXPECT_EQ(calls_.threads.size(), 3u);
  }
  // The pool's threads are kept: the next split runs on the same three.
  ASSERT_TRUE(executor->Execute(Allreduce({0}, {n}), trace_).ok());
  absl::MutexLock lock(&calls_.mu);
  EXPECT_EQ(calls_.threads.size(), 3u);
  EXPECT_EQ(calls_.lines.size(), 6u);
}

TEST_F(CpuExecutorTest, ASmallAllreduceUsesTheFirstCommunicatorAlone) {
  auto executor = Make(/*communicators=*/3, /*split_bytes=*/1024);
  ASSERT_TRUE(executor->Execute(Allreduce({0}, {255}), trace_).ok());  // 1020 bytes
  EXPECT_THAT(Lines(), ElementsAre("c0 allreduce 255 op=2"));
}

TEST_F(CpuExecutorTest, BroadcastAndBarrier) {
  auto executor = Make();
  Collective b;
  b.type = Collective::Type::kBroadcast;
  b.dtype = DataType::kFloat32;
  b.root = 2;
  b.tensors.push_back({128, 0, {4}});
  b.sizes = {4};
  ASSERT_TRUE(executor->Execute(b, trace_).ok());
  EXPECT_EQ(arena_[128], 0x7f);
  EXPECT_EQ(arena_[128 + 15], 0x7f);
  EXPECT_EQ(arena_[128 + 16], 0);  // exactly the tensor's 16 bytes
  Collective barrier;
  barrier.type = Collective::Type::kBarrier;
  ASSERT_TRUE(executor->Execute(barrier, trace_).ok());
  EXPECT_THAT(Lines(), ElementsAre("c0 broadcast 16 root=2", "c0 barrier"));
}

Collective Allgather() {
  Collective c;
  c.type = Collective::Type::kAllgather;
  c.dtype = DataType::kFloat32;
  c.tensors.push_back({0, 0, {1, 2}});  // this rank (0): 1 row of 2
  c.tensors.push_back({64, 0, {2}});    // 2 rows of 1
  c.sizes = {1, 1, 2, 1, 2, 1, 1, 1};   // tensor-major: 4 ranks each
  c.row_elements = {2, 1};
  return c;
}

TEST_F(CpuExecutorTest, AllgatherOutputsArePlacedInTheOutputArena) {
  auto executor = Make();
  Floats(0)[0] = 1.5f;
  Floats(0)[1] = 2.5f;
  absl::StatusOr<Executed> e = executor->Execute(Allgather(), trace_);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ(e->outputs.size(), 2u);
  EXPECT_THAT(e->outputs[0].shape, ElementsAre(5, 2));  // 1+1+2+1 rows
  EXPECT_THAT(e->outputs[1].shape, ElementsAre(5));     // 2+1+1+1
  EXPECT_GE(e->outputs[0].offset, 6 << 20);
  EXPECT_EQ(Floats(e->outputs[0].offset)[0], 1.5f);  // this rank's row first
  EXPECT_EQ(Floats(e->outputs[0].offset)[1], 2.5f);
  EXPECT_EQ(arena_[e->outputs[0].offset + 8], 11);  // then rank 1's bytes
  EXPECT_THAT(Lines(), ElementsAre("c0 allgatherv 8/8/16/8", "c0 allgatherv 8/4/4/4"));
  EXPECT_EQ(outputs_.free_bytes(), (2u << 20) - 2 * 64);  // two outputs, 64-byte aligned
}

TEST_F(CpuExecutorTest, AFailedAllgatherGivesEarlierOutputsBack) {
  auto executor = Make();
  calls_.fail_allgather_after = absl::UnavailableError("gloo allgather: peer 2 closed");
  const size_t before = outputs_.free_bytes();
  absl::StatusOr<Executed> e = executor->Execute(Allgather(), trace_);
  EXPECT_EQ(e.status(), absl::UnavailableError("gloo allgather: peer 2 closed"));
  EXPECT_EQ(outputs_.free_bytes(), before);
}

TEST_F(CpuExecutorTest, AMalformedAllgatherIsRefusedAndNotFatal) {
  auto executor = Make();
  Collective c = Allgather();
  c.sizes.resize(5);
  absl::StatusOr<Executed> e = executor->Execute(c, trace_);
  EXPECT_EQ(e.status(),
            absl::InvalidArgumentError("allgather response has 5 sizes for 2 tensors on 4 ranks"));
  EXPECT_FALSE(executor->Fatal(e.status()));
  EXPECT_TRUE(executor->Fatal(absl::UnavailableError("peer gone")));
  EXPECT_TRUE(Lines().empty());
}

// Each refusal of a process set's collective is made alike by every member before any call of its
// communicator: it fails that collective alone, and the next one works.
TEST_F(CpuExecutorTest, AProcessSetsRefusalsFailOnlyTheirCollectiveAndTheNextWorks) {
  CpuExecutorOptions o;
  o.rank = 0;
  o.size = 4;
  o.arena = arena_.data();
  o.outputs = &outputs_;
  o.make_backend = [this](int index) -> absl::StatusOr<std::unique_ptr<Backend>> {
    return std::make_unique<FakeBackend>(index, 0, 4, &calls_);
  };
  int made = 0;
  o.make_set_backend = [&](const std::string&, int rank,
                           int size) -> absl::StatusOr<std::unique_ptr<Backend>> {
    ++made;
    return std::make_unique<FakeBackend>(100 + made, rank, size, &calls_);
  };
  CpuExecutor executor(std::move(o));
  ASSERT_TRUE(executor.Setup().ok());
  auto in_set = [](int32_t id, std::vector<int32_t> ranks) {
    Collective c = Allreduce({0}, {4});
    c.process_set_id = id;
    c.process_set_ranks = std::move(ranks);
    return c;
  };
  auto next_works = [&] {
    Floats(0)[0] = 1;
    EXPECT_TRUE(executor.Execute(Allreduce({0}, {4}), trace_).ok());
    EXPECT_EQ(Floats(0)[0], 4);  // summed over the 4 ranks
  };

  absl::Status s = executor.Execute(in_set(1, {1, 2}), trace_).status();
  EXPECT_EQ(s, absl::InvalidArgumentError("rank 0 is not in process set 1"));
  EXPECT_FALSE(executor.Fatal(s));
  next_works();

  for (int32_t id = 1; id <= static_cast<int32_t>(CpuExecutor::kMaxProcessSets); ++id) {
    Collective barrier = in_set(id, {0, 3});  // quicker than the fake's allreduce
    barrier.type = Collective::Type::kBarrier;
    ASSERT_TRUE(executor.Execute(barrier, trace_).ok()) << id;
  }
  s = executor.Execute(in_set(9999, {0, 3}), trace_).status();
  EXPECT_EQ(s, absl::ResourceExhaustedError(
                   "a rank keeps the communicators of at most 256 process sets: remove the ones "
                   "no longer used (hvd.remove_process_set)"));
  EXPECT_FALSE(executor.Fatal(s));
  next_works();

  executor.ReleaseProcessSet(7);
  s = executor.Execute(in_set(7, {0, 3}), trace_).status();
  EXPECT_EQ(s, absl::InvalidArgumentError("process set 7 was removed"));
  EXPECT_FALSE(executor.Fatal(s));
  next_works();
  // The released set's room is free again for a new one.
  EXPECT_TRUE(executor.Execute(in_set(9999, {0, 3}), trace_).ok());
  EXPECT_EQ(made, 257);
}

TEST_F(CpuExecutorTest, ACommunicatorThatCannotBeCreatedFailsSetup) {
  setup_ = absl::DeadlineExceededError("gloo rendezvous timed out");
  CpuExecutorOptions o;
  o.size = 4;
  o.arena = arena_.data();
  o.outputs = &outputs_;
  o.make_backend = [this](int) -> absl::StatusOr<std::unique_ptr<Backend>> { return setup_; };
  CpuExecutor executor(std::move(o));
  EXPECT_EQ(executor.Setup(), absl::DeadlineExceededError("gloo rendezvous timed out"));
  EXPECT_EQ(executor.Execute(Allreduce({0}, {1}), trace_).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace ringmaster
