// The shared-memory host group across real processes: one forked process per rank, meeting through
// a key-value store in a directory (a file per key), as daemons meet through the coordinator's.
#include "worker/cpu/shm_group.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/half.h"
#include "common/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/cpu/directory_store.h"
#include "worker/cpu/reduce_kernels.h"
#include "worker/rendezvous/key_value_store.h"

namespace ringmaster {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr absl::Duration kTimeout = absl::Seconds(20);

std::string Describe(const absl::Status& status) {
  return absl::StrCat(absl::StatusCodeToString(status.code()), ": ", status.message());
}

class ShmGroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/shm_group_test.XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  ShmGroupOptions Options(int rank, int np, absl::Duration timeout = kTimeout) {
    ShmGroupOptions o;
    o.rank = rank;
    o.size = np;
    o.store = std::make_shared<DirectoryStore>(dir_);
    o.host = "host-a";
    o.slot_bytes = 1024;  // many chunks even for small tensors
    o.timeout = timeout;
    return o;
  }

  // Runs `body` in one forked process per rank and returns what each returned, in rank order.
  std::vector<std::string> RunRanks(int np, const std::function<std::string(int rank)>& body) {
    std::vector<pid_t> children;
    for (int rank = 0; rank < np; ++rank) {
      const pid_t child = fork();
      if (child == 0) {
        alarm(60);  // a broken test fails, never hangs
        const std::string out = body(rank);
        std::ofstream(absl::StrCat(dir_, "/result.", rank), std::ios::binary) << out;
        _exit(0);
      }
      children.push_back(child);
    }
    std::vector<std::string> results;
    for (int rank = 0; rank < np; ++rank) {
      int status = 0;
      waitpid(children[rank], &status, 0);
      std::ifstream in(absl::StrCat(dir_, "/result.", rank), std::ios::binary);
      results.push_back(in ? std::string(std::istreambuf_iterator<char>(in), {})
                           : absl::StrCat("rank ", rank, " wrote nothing (status ", status, ")"));
    }
    return results;
  }

  std::string dir_;
};

// Rank r's element i, as a small integer every dtype holds exactly.
double Value(int rank, int64_t i, DataType dtype) {
  const int v = static_cast<int>((rank * 7 + i * 3) % 11);
  return dtype == DataType::kUint8 ? v : v - 5;
}

std::vector<uint8_t> Input(int rank, int64_t count, DataType dtype) {
  std::vector<uint8_t> bytes(count * DataTypeSize(dtype));
  for (int64_t i = 0; i < count; ++i) {
    const double v = Value(rank, i, dtype);
    void* p = bytes.data() + i * DataTypeSize(dtype);
    switch (dtype) {
      case DataType::kUint8:
        *static_cast<uint8_t*>(p) = static_cast<uint8_t>(v);
        break;
      case DataType::kInt8:
        *static_cast<int8_t*>(p) = static_cast<int8_t>(v);
        break;
      case DataType::kInt32:
        *static_cast<int32_t*>(p) = static_cast<int32_t>(v);
        break;
      case DataType::kInt64:
        *static_cast<int64_t*>(p) = static_cast<int64_t>(v);
        break;
      case DataType::kFloat16:
        *static_cast<uint16_t*>(p) = FloatToHalf(static_cast<float>(v));
        break;
      case DataType::kBfloat16:
        *static_cast<uint16_t*>(p) = FloatToBfloat16(static_cast<float>(v));
        break;
      case DataType::kFloat32:
        *static_cast<float*>(p) = static_cast<float>(v);
        break;
      case DataType::kFloat64:
        *static_cast<double*>(p) = v;
        break;
      case DataType::kUnspecified:
        break;
    }
  }
  return bytes;
}

constexpr DataType kDtypes[] = {DataType::kUint8,   DataType::kInt8,    DataType::kInt32,
                                DataType::kInt64,   DataType::kFloat16, DataType::kBfloat16,
                                DataType::kFloat32, DataType::kFloat64};
constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct};
constexpr int64_t kCounts[] = {0, 1, 17, 1000, 5000};

void NoScaling(void*, int64_t) {}
absl::Status Reduced(void*, int64_t) { return absl::OkStatus(); }

class ShmGroupRanksTest : public ShmGroupTest, public ::testing::WithParamInterface<int> {};

// Every dtype, op and count (0, less than a slice, several chunks with a ragged last one), one
// group used for all of them in sequence: each rank ends with the ranks' values folded in rank
// order, bit for bit.
TEST_P(ShmGroupRanksTest, EveryOpDtypeAndCountMatchesTheReferenceOnEveryRank) {
  const int np = GetParam();
  std::vector<std::string> results = RunRanks(np, [&](int rank) -> std::string {
    absl::StatusOr<std::unique_ptr<ShmGroup>> group = ConnectShmGroup(Options(rank, np));
    if (!group.ok()) return Describe(group.status());
    if (*group == nullptr) return "no group";
    std::string out;
    for (DataType dtype : kDtypes) {
      for (ReduceOp op : kOps) {
        for (int64_t count : kCounts) {
          std::vector<uint8_t> data = Input(rank, count, dtype);
          absl::Status s = (*group)->Allreduce(data.data(), count, dtype, op, NoScaling, Reduced);
          if (!s.ok()) return Describe(s);
          out.append(data.begin(), data.end());
        }
      }
    }
    return out;
  });
  std::string expected;
  for (DataType dtype : kDtypes) {
    for (ReduceOp op : kOps) {
      const ReduceFn reduce = *ReduceFunction(dtype, op);
      for (int64_t count : kCounts) {
        std::vector<uint8_t> acc = Input(0, count, dtype);
        for (int r = 1; r < np; ++r) {
          std::vector<uint8_t> next = Input(r, count, dtype);
          reduce(acc.data(), acc.data(), next.data(), count);
        }
        expected.append(acc.begin(), acc.end());
      }
    }
  }
  for (int rank = 0; rank < np; ++rank) {
    ASSERT_EQ(results[rank].size(), expected.size()) << "rank " << rank << ": " << results[rank];
    EXPECT_TRUE(results[rank] == expected) << "rank " << rank << " differs from the reference";
  }
}

// The scaling hooks run once per element: every rank's input doubled before, the sum divided by
// the ranks after, so the result is twice the mean.
TEST_P(ShmGroupRanksTest, ScalingHooksApplyOncePerElement) {
  const int np = GetParam();
  constexpr int64_t kCount = 3001;
  std::vector<std::string> results = RunRanks(np, [&](int rank) -> std::string {
    absl::StatusOr<std::unique_ptr<ShmGroup>> group = ConnectShmGroup(Options(rank, np));
    if (!group.ok() || *group == nullptr) return "no group";
    std::vector<double> data(kCount);
    for (int64_t i = 0; i < kCount; ++i) data[i] = static_cast<double>(rank * 1000 + i);
    absl::Status s = (*group)->Allreduce(
        data.data(), kCount, DataType::kFloat64, ReduceOp::kSum,
        [](void* p, int64_t n) {
          for (int64_t i = 0; i < n; ++i) static_cast<double*>(p)[i] *= 2;
        },
        [np](void* p, int64_t n) {
          for (int64_t i = 0; i < n; ++i) static_cast<double*>(p)[i] /= np;
          return absl::OkStatus();
        });
    if (!s.ok()) return Describe(s);
    return std::string(reinterpret_cast<const char*>(data.data()), kCount * sizeof(double));
  });
  std::vector<double> expected(kCount);
  for (int64_t i = 0; i < kCount; ++i) {
    double sum = 0;
    for (int r = 0; r < np; ++r) sum += 2.0 * (r * 1000 + i);
    expected[i] = sum / np;
  }
  const std::string want(reinterpret_cast<const char*>(expected.data()), kCount * sizeof(double));
  for (int rank = 0; rank < np; ++rank) {
    EXPECT_TRUE(results[rank] == want) << "rank " << rank << ": " << results[rank].substr(0, 200);
  }
}

// Small allreduces (one barrier, inputs alternating between the halves of the slots) back to back
// and between larger ones (two barriers per chunk), with ranks running late by turns: a rank that
// runs ahead must never overwrite inputs a slower rank is still reading. Every result exact.
TEST_P(ShmGroupRanksTest, SmallAllreducesBackToBackAndBetweenLargeOnesStayExactWithRanksLate) {
  const int np = GetParam();
  constexpr int kIterations = 1500;
  auto value = [](int rank, int64_t i, int iter) {
    return static_cast<int64_t>((rank * 31 + i * 7 + iter * 13) % 101);
  };
  auto count_of = [](int iter) -> int64_t { return iter % 9 == 8 ? 300 : 1 + iter % 40; };
  std::vector<std::string> results = RunRanks(np, [&](int rank) -> std::string {
    absl::StatusOr<std::unique_ptr<ShmGroup>> group = ConnectShmGroup(Options(rank, np));
    if (!group.ok() || *group == nullptr) return "no group";
    for (int iter = 0; iter < kIterations; ++iter) {
      if ((iter / 7) % np == rank && iter % 3 == 0) absl::SleepFor(absl::Microseconds(200));
      const int64_t count = count_of(iter);  // 8..320 bytes: small; 2400 bytes: two chunks
      std::vector<int64_t> data(count);
      for (int64_t i = 0; i < count; ++i) data[i] = value(rank, i, iter);
      absl::Status s = (*group)->Allreduce(data.data(), count, DataType::kInt64, ReduceOp::kSum,
                                           NoScaling, Reduced);
      if (!s.ok()) return Describe(s);
      for (int64_t i = 0; i < count; ++i) {
        int64_t want = 0;
        for (int r = 0; r < np; ++r) want += value(r, i, iter);
        if (data[i] != want) {
          return absl::StrCat("iteration ", iter, " element ", i, ": ", data[i], ", not ", want);
        }
      }
    }
    return std::string("ok");
  });
  for (int rank = 0; rank < np; ++rank) EXPECT_EQ(results[rank], "ok") << "rank " << rank;
}

// Allgather through the segment: parts of different sizes (none, less than a slot, several slots
// with a ragged end), after a small allreduce and before another, and in place (a rank's part
// already at its place in the output): every rank ends with every part, in rank order.
TEST_P(ShmGroupRanksTest, AllgatherGathersEveryPartInRankOrderOnEveryRank) {
  const int np = GetParam();
  auto part_bytes = [](int r, int round) -> int64_t { return (r * 1237 + round * 611) % 3001; };
  auto byte = [](int r, int64_t i) { return static_cast<uint8_t>(r * 37 + i * 11); };
  std::vector<std::string> results = RunRanks(np, [&](int rank) -> std::string {
    absl::StatusOr<std::unique_ptr<ShmGroup>> group = ConnectShmGroup(Options(rank, np));
    if (!group.ok() || *group == nullptr) return "no group";
    auto no_cross = [](const void*, void*, absl::Span<const int64_t>) {
      return absl::InternalError("one host: no cross step");
    };
    std::string out;
    for (int round = 0; round < 4; ++round) {
      std::vector<int64_t> bytes(np);
      for (int r = 0; r < np; ++r) bytes[r] = round == 3 && r == 1 ? 0 : part_bytes(r, round);
      std::vector<uint8_t> mine(bytes[rank]);
      for (int64_t i = 0; i < bytes[rank]; ++i) mine[i] = byte(rank, i + round);
      std::vector<uint8_t> gathered(std::accumulate(bytes.begin(), bytes.end(), int64_t{0}));
      const void* in = mine.data();
      if (round == 2) {  // in place
        int64_t at = 0;
        for (int r = 0; r < rank; ++r) at += bytes[r];
        std::copy(mine.begin(), mine.end(), gathered.begin() + at);
        in = gathered.data() + at;
      }
      int32_t one = rank + 1;  // a small allreduce between the allgathers
      if (absl::Status s =
              (*group)->Allreduce(&one, 1, DataType::kInt32, ReduceOp::kSum, NoScaling, Reduced);
          !s.ok()) {
        return Describe(s);
      }
      if (absl::Status s = (*group)->Allgatherv(in, gathered.data(), bytes, no_cross); !s.ok()) {
        return Describe(s);
      }
      absl::StrAppend(&out, "sum ", one, " ");
      out.append(gathered.begin(), gathered.end());
    }
    return out;
  });
  std::string expected;
  for (int round = 0; round < 4; ++round) {
    absl::StrAppend(&expected, "sum ", np * (np + 1) / 2, " ");
    for (int r = 0; r < np; ++r) {
      const int64_t n = round == 3 && r == 1 ? 0 : part_bytes(r, round);
      for (int64_t i = 0; i < n; ++i) expected.push_back(static_cast<char>(byte(r, i + round)));
    }
  }
  for (int rank = 0; rank < np; ++rank) {
    EXPECT_TRUE(results[rank] == expected)
        << "rank " << rank << ": " << results[rank].substr(0, 80);
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, ShmGroupRanksTest, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("np", info.param);
                         });

// Ranks on different hosts share nothing: every rank gets no group, and no error.
TEST_F(ShmGroupTest, RanksOfDifferentHostsFormNoGroup) {
  std::vector<std::string> results = RunRanks(3, [&](int rank) -> std::string {
    ShmGroupOptions o = Options(rank, 3);
    o.host = rank == 2 ? "host-b" : "host-a";
    absl::StatusOr<std::unique_ptr<ShmGroup>> group = ConnectShmGroup(std::move(o));
    if (!group.ok()) return Describe(group.status());
    return *group == nullptr ? "no group" : "group";
  });
  EXPECT_EQ(results, (std::vector<std::string>{"no group", "no group", "no group"}));
}

// Across hosts, each host's ranks form their own group, numbered in rank order, and reduce only
// their own values; `after` sees slices that line up across hosts (local rank i: the same offsets
// and sizes on every host), so a cross-host allreduce of each can complete the sum.
TEST_F(ShmGroupTest, AcrossHostsEachHostFormsItsOwnGroupWithSlicesThatLineUp) {
  constexpr int64_t kCount = 3000;
  std::vector<std::string> results = RunRanks(4, [&](int rank) -> std::string {
    ShmGroupOptions o = Options(rank, 4);
    o.host = rank == 0 || rank == 2 ? "host-a" : "host-b";  // hosts interleaved by rank
    o.across_hosts = true;
    absl::StatusOr<std::unique_ptr<ShmGroup>> group = ConnectShmGroup(std::move(o));
    if (!group.ok()) return Describe(group.status());
    if (*group == nullptr) return "no group";
    std::vector<int32_t> data(kCount, rank + 1);
    std::string slices;
    absl::Status s = (*group)->Allreduce(data.data(), kCount, DataType::kInt32, ReduceOp::kSum,
                                         NoScaling, [&](void* p, int64_t n) {
                                           absl::StrAppend(&slices, " ", n);
                                           return absl::OkStatus();
                                         });
    if (!s.ok()) return Describe(s);
    const bool uniform =
        std::all_of(data.begin(), data.end(), [&](int32_t v) { return v == data[0]; });
    return absl::StrCat("local ", (*group)->rank(), "/", (*group)->size(), " host ",
                        (*group)->host_index(), "/", (*group)->hosts(), " sum ", data[0],
                        uniform ? "" : " (not uniform)", " slices", slices);
  });
  // 3000 int32 in 1 KiB slots: 11 chunks of 256 and one of 184, each split on 16-element lines.
  const std::string first = " 128 128 128 128 128 128 128 128 128 128 128 80";
  const std::string second = " 128 128 128 128 128 128 128 128 128 128 128 104";
  EXPECT_EQ(results, (std::vector<std::string>{
                         "local 0/2 host 0/2 sum 4 slices" + first,
                         "local 0/2 host 1/2 sum 6 slices" + first,
                         "local 1/2 host 0/2 sum 4 slices" + second,
                         "local 1/2 host 1/2 sum 6 slices" + second,
                     }));
}

// Allgather across hosts: each rank gathers its local index's parts over the "network" (here the
// test's store, in host order), then the host's ranks exchange them through the segment; every
// rank ends with every job rank's part in job rank order, though hosts interleave by rank.
TEST_F(ShmGroupTest, AcrossHostsAllgatherPlacesEveryHostsPartsInJobRankOrder) {
  auto part = [](int r) { return std::string(static_cast<size_t>(700 * r + 300), "ABCD"[r]); };
  std::vector<std::string> results = RunRanks(4, [&](int rank) -> std::string {
    ShmGroupOptions o = Options(rank, 4);
    o.host = rank == 0 || rank == 2 ? "host-a" : "host-b";
    o.across_hosts = true;
    absl::StatusOr<std::unique_ptr<ShmGroup>> group = ConnectShmGroup(std::move(o));
    if (!group.ok()) return Describe(group.status());
    if (*group == nullptr) return "no group";
    // The ranks of this local index, one per host in host order: {0, 1} and {2, 3}.
    const std::vector<int> peers =
        rank % 2 == 0 ? std::vector<int>{rank, rank + 1} : std::vector<int>{rank - 1, rank};
    DirectoryStore store(dir_);
    std::string cross_bytes;
    auto across = [&](const void* in, void* out, absl::Span<const int64_t> bytes) -> absl::Status {
      absl::StrAppend(&cross_bytes, absl::StrJoin(bytes, "/"));
      const std::string mine(static_cast<const char*>(in), part(rank).size());
      if (absl::Status s = store.Set(absl::StrCat("cross/", rank), mine); !s.ok()) return s;
      absl::StatusOr<std::vector<std::string>> got = store.Wait(
          {absl::StrCat("cross/", peers[0]), absl::StrCat("cross/", peers[1])}, kTimeout);
      if (!got.ok()) return got.status();
      std::string joined = (*got)[0] + (*got)[1];
      std::memcpy(out, joined.data(), joined.size());
      return absl::OkStatus();
    };
    std::vector<int64_t> bytes;
    for (int r = 0; r < 4; ++r) bytes.push_back(static_cast<int64_t>(part(r).size()));
    std::string gathered(std::accumulate(bytes.begin(), bytes.end(), int64_t{0}), '.');
    const std::string mine = part(rank);
    if (absl::Status s = (*group)->Allgatherv(mine.data(), gathered.data(), bytes, across);
        !s.ok()) {
      return Describe(s);
    }
    return absl::StrCat(cross_bytes, " ", gathered == part(0) + part(1) + part(2) + part(3));
  });
  EXPECT_EQ(results,
            (std::vector<std::string>{"300/1000 1", "300/1000 1", "1700/2400 1", "1700/2400 1"}));
}

// Across hosts only when every host runs as many ranks, two or more: otherwise no group anywhere.
TEST_F(ShmGroupTest, AcrossHostsUnevenHostsFormNoGroup) {
  std::vector<std::string> results = RunRanks(3, [&](int rank) -> std::string {
    ShmGroupOptions o = Options(rank, 3);
    o.host = rank == 2 ? "host-b" : "host-a";
    o.across_hosts = true;
    absl::StatusOr<std::unique_ptr<ShmGroup>> group = ConnectShmGroup(std::move(o));
    if (!group.ok()) return Describe(group.status());
    return *group == nullptr ? "no group" : "group";
  });
  EXPECT_EQ(results, (std::vector<std::string>{"no group", "no group", "no group"}));
}

// A failing `after` (a cross-host allreduce that failed) fails the collective on every rank of the
// host with its status.
TEST_F(ShmGroupTest, AFailingAfterFailsEveryRankOfTheHost) {
  std::vector<std::string> results = RunRanks(2, [&](int rank) -> std::string {
    absl::StatusOr<std::unique_ptr<ShmGroup>> group = ConnectShmGroup(Options(rank, 2));
    if (!group.ok() || *group == nullptr) return "no group";
    std::vector<float> data(1000, 1.0f);
    absl::Status s = (*group)->Allreduce(
        data.data(), 1000, DataType::kFloat32, ReduceOp::kSum, NoScaling, [rank](void*, int64_t) {
          return rank == 1 ? absl::UnavailableError("gloo allreduce failed on rank 3: peer gone")
                           : absl::OkStatus();
        });
    return Describe(s);
  });
  EXPECT_EQ(results[1], "UNAVAILABLE: gloo allreduce failed on rank 3: peer gone");
  EXPECT_EQ(results[0],
            "UNAVAILABLE: shared-memory allreduce failed on rank 1: gloo allreduce failed on rank "
            "3: peer gone");
}

// A rank whose process exits fails the others' allreduce within about a second, naming it; later
// allreduces are refused, naming the first failure.
TEST_F(ShmGroupTest, ARankThatExitsFailsTheOthersNamingIt) {
  std::vector<std::string> results = RunRanks(3, [&](int rank) -> std::string {
    absl::StatusOr<std::unique_ptr<ShmGroup>> group = ConnectShmGroup(Options(rank, 3));
    if (!group.ok() || *group == nullptr) return "no group";
    if (rank == 2) _exit(1);
    std::vector<float> data(100, 1.0f);
    const absl::Time start = absl::Now();
    absl::Status first = (*group)->Allreduce(data.data(), 100, DataType::kFloat32, ReduceOp::kSum,
                                             NoScaling, Reduced);
    const absl::Duration took = absl::Now() - start;
    absl::Status second = (*group)->Allreduce(data.data(), 100, DataType::kFloat32, ReduceOp::kSum,
                                              NoScaling, Reduced);
    return absl::StrCat(took < absl::Seconds(3) ? "fast" : "slow", "\n", Describe(first), "\n",
                        Describe(second));
  });
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_THAT(results[rank], AllOf(StartsWith("fast\nUNAVAILABLE: "),
                                     HasSubstr("rank 2's worker (pid "), HasSubstr(") exited\n"),
                                     HasSubstr("FAILED_PRECONDITION: shared-memory allreduce "
                                               "refused on rank ")))
        << "rank " << rank;
  }
}

// A rank that never arrives: the wait ends at the timeout, naming it.
TEST_F(ShmGroupTest, ARankThatNeverArrivesTimesOutNamingIt) {
  std::vector<std::string> results = RunRanks(2, [&](int rank) -> std::string {
    absl::StatusOr<std::unique_ptr<ShmGroup>> group =
        ConnectShmGroup(Options(rank, 2, absl::Milliseconds(500)));
    if (!group.ok() || *group == nullptr) return "no group";
    if (rank == 1) {
      absl::SleepFor(absl::Seconds(2));
      return "slept";
    }
    std::vector<float> data(10, 1.0f);
    const absl::Time start = absl::Now();
    absl::Status s = (*group)->Allreduce(data.data(), 10, DataType::kFloat32, ReduceOp::kSum,
                                         NoScaling, Reduced);
    const absl::Duration took = absl::Now() - start;
    return absl::StrCat(
        took >= absl::Milliseconds(500) && took < absl::Seconds(2) ? "on time" : "late", "\n",
        Describe(s));
  });
  EXPECT_EQ(results[0],
            "on time\nDEADLINE_EXCEEDED: shared-memory allreduce on rank 0 timed out after 500ms "
            "waiting for rank(s) 1");
  EXPECT_EQ(results[1], "slept");
}

// Across hosts, a host's rank held up in its cross-host step (the straggler is on another host) is
// named as such by the host's rank whose barrier times out.
TEST_F(ShmGroupTest, AcrossHostsATimeoutNamesTheRankStillInItsCrossHostStep) {
  std::vector<std::string> results = RunRanks(4, [&](int rank) -> std::string {
    ShmGroupOptions o = Options(rank, 4, absl::Milliseconds(500));
    o.host = rank == 0 || rank == 2 ? "host-a" : "host-b";
    o.across_hosts = true;
    absl::StatusOr<std::unique_ptr<ShmGroup>> group = ConnectShmGroup(std::move(o));
    if (!group.ok() || *group == nullptr) return "no group";
    auto stuck = [rank] {
      if (rank == 2) absl::SleepFor(absl::Milliseconds(1500));  // its peer on host-b is late
    };
    std::vector<float> data(10, 1.0f);
    absl::Status s = (*group)->Allreduce(data.data(), 10, DataType::kFloat32, ReduceOp::kSum,
                                         NoScaling, [&](void*, int64_t) {
                                           stuck();
                                           return absl::OkStatus();
                                         });
    return rank == 0 ? Describe(s) : "";
  });
  EXPECT_EQ(results[0],
            "DEADLINE_EXCEEDED: shared-memory allreduce on rank 0 timed out after 500ms: rank(s) 2 "
            "still in the cross-host step, waiting for the ranks of their local index on the other "
            "hosts");
}

// Abort, from another thread, ends this rank's wait at once and fails the next allreduce of every
// other rank with the reason.
TEST_F(ShmGroupTest, AbortEndsTheWaitOnEveryRank) {
  std::vector<std::string> results = RunRanks(2, [&](int rank) -> std::string {
    absl::StatusOr<std::unique_ptr<ShmGroup>> group = ConnectShmGroup(Options(rank, 2));
    if (!group.ok() || *group == nullptr) return "no group";
    ShmGroup* g = group->get();
    std::vector<float> data(10, 1.0f);
    if (rank == 1) absl::SleepFor(absl::Seconds(1));  // rank 0 is waiting and aborted meanwhile
    std::thread aborter;
    if (rank == 0) {
      aborter = std::thread([g] {
        absl::SleepFor(absl::Milliseconds(200));
        g->Abort("job stopped");
      });
    }
    const absl::Time start = absl::Now();
    absl::Status s =
        g->Allreduce(data.data(), 10, DataType::kFloat32, ReduceOp::kSum, NoScaling, Reduced);
    const absl::Duration took = absl::Now() - start;
    if (aborter.joinable()) aborter.join();
    return absl::StrCat(took < absl::Seconds(2) ? "fast" : "slow", "\n", Describe(s));
  });
  EXPECT_EQ(results[0], "fast\nABORTED: aborted on rank 0: job stopped");
  EXPECT_EQ(results[1],
            "fast\nABORTED: shared-memory allreduce failed on rank 0: aborted on rank 0: job "
            "stopped");
}

// A rank that never shows up fails the rendezvous at the timeout.
TEST_F(ShmGroupTest, RendezvousTimesOutWhenARankNeverShowsUp) {
  absl::StatusOr<std::unique_ptr<ShmGroup>> group =
      ConnectShmGroup(Options(0, 2, absl::Milliseconds(300)));
  EXPECT_EQ(group.status().code(), absl::StatusCode::kDeadlineExceeded) << group.status();
}

TEST_F(ShmGroupTest, RejectsBadOptions) {
  EXPECT_EQ(ConnectShmGroup(Options(2, 2)).status().code(), absl::StatusCode::kInvalidArgument);
  ShmGroupOptions o = Options(0, 2);
  o.store = nullptr;
  EXPECT_EQ(ConnectShmGroup(std::move(o)).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ringmaster
