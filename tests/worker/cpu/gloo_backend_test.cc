// Multi-rank tests of the Gloo backend: one thread per rank, connected over loopback through the
// in-memory rendezvous store.
#include "worker/cpu/gloo_backend.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/half.h"
#include "common/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/rendezvous/key_value_store.h"

namespace ringmaster {
namespace {

using ::testing::AnyOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Long enough never to fire on a loaded machine, short enough that a broken test fails, not hangs.
constexpr absl::Duration kTimeout = absl::Seconds(10);

GlooBackendOptions Options(int rank, int size, std::shared_ptr<KeyValueStore> store,
                           absl::Duration timeout = kTimeout) {
  GlooBackendOptions options;
  options.rank = rank;
  options.size = size;
  options.store = std::move(store);
  options.prefix = "gloo/";
  options.timeout = timeout;
  return options;
}

// Connects `np` ranks, one thread each, and runs `body` on every rank's thread. The backends are
// destroyed only after every thread has finished, so no rank closes its sockets under a peer that
// is still reading.
void RunRanks(int np, const std::function<void(Backend&)>& body) {
  auto store = KeyValueStore::InMemory();
  std::vector<std::unique_ptr<Backend>> backends(np);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < np; ++rank) {
    threads.emplace_back([&, rank] {
      absl::StatusOr<std::unique_ptr<Backend>> backend =
          CreateGlooBackend(Options(rank, np, store));
      ASSERT_TRUE(backend.ok()) << backend.status();
      backends[rank] = *std::move(backend);
      EXPECT_EQ(backends[rank]->rank(), rank);
      EXPECT_EQ(backends[rank]->size(), np);
      body(*backends[rank]);
    });
  }
  for (std::thread& thread : threads) thread.join();
}

std::string NpName(const testing::TestParamInfo<int>& info) {
  return absl::StrCat("np", info.param);
}

// ---- Allreduce: every dtype x op x count, against a reference computed here ----

using Bytes = std::vector<uint8_t>;

template <typename T>
std::vector<T> AsVector(const Bytes& bytes) {
  std::vector<T> v(bytes.size() / sizeof(T));
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}
template <typename T>
Bytes AsBytes(const std::vector<T>& v) {
  Bytes bytes(v.size() * sizeof(T));
  std::memcpy(bytes.data(), v.data(), bytes.size());
  return bytes;
}

float Widen(DataType dtype, uint16_t bits) {
  return dtype == DataType::kFloat16 ? HalfToFloat(bits) : Bfloat16ToFloat(bits);
}
uint16_t Narrow(DataType dtype, float value) {
  return dtype == DataType::kFloat16 ? FloatToHalf(value) : FloatToBfloat16(value);
}
bool IsNanBits(DataType dtype, uint64_t bits) {
  switch (dtype) {
    case DataType::kFloat16:
      return (bits & 0x7C00) == 0x7C00 && (bits & 0x3FF) != 0;
    case DataType::kBfloat16:
      return (bits & 0x7F80) == 0x7F80 && (bits & 0x7F) != 0;
    case DataType::kFloat32:
      return std::isnan(std::bit_cast<float>(static_cast<uint32_t>(bits)));
    case DataType::kFloat64:
      return std::isnan(std::bit_cast<double>(bits));
    default:
      return false;
  }
}

// One rank's input. Integers are arbitrary bits (sums and products wrap, which is
// order-independent). Floating-point sums and products use small integers, so every reduction order
// gives the exact same result; min and max use arbitrary non-NaN bit patterns (infinities and
// subnormals included), minus -0, which compares equal to +0 and would make the answer depend on
// the order.
Bytes Generate(DataType dtype, ReduceOp op, int64_t count, std::mt19937_64& rng) {
  const int size = DataTypeSize(dtype);
  const bool is_float = dtype == DataType::kFloat16 || dtype == DataType::kBfloat16 ||
                        dtype == DataType::kFloat32 || dtype == DataType::kFloat64;
  Bytes bytes(count * size);
  if (!is_float) {
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
    return bytes;
  }
  const uint64_t sign_bit = uint64_t{1} << (8 * size - 1);
  const uint64_t mask = size == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * size)) - 1;
  const int bound = op == ReduceOp::kProduct ? 3 : 32;
  std::uniform_int_distribution<int> small(-bound, bound);
  for (int64_t i = 0; i < count; ++i) {
    uint64_t bits;
    if (op == ReduceOp::kMin || op == ReduceOp::kMax) {
      do {
        bits = rng() & mask;
      } while (IsNanBits(dtype, bits) || bits == sign_bit);
    } else {
      const float v = static_cast<float>(small(rng));
      switch (dtype) {
        case DataType::kFloat32:
          bits = std::bit_cast<uint32_t>(v);
          break;
        case DataType::kFloat64:
          bits = std::bit_cast<uint64_t>(static_cast<double>(v));
          break;
        default:
          bits = Narrow(dtype, v);
          break;
      }
    }
    std::memcpy(&bytes[i * size], &bits, size);  // Little-endian: the low `size` bytes.
  }
  return bytes;
}

template <typename T>
T ReduceIntegers(ReduceOp op, T a, T b) {
  using U = std::make_unsigned_t<T>;
  switch (op) {
    case ReduceOp::kSum:
      return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    case ReduceOp::kProduct:
      return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
    case ReduceOp::kMin:
      return std::min(a, b);
    case ReduceOp::kMax:
      return std::max(a, b);
    default:
      ADD_FAILURE() << "unexpected op";
      return a;
  }
}

template <typename T>
T ReduceFloats(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::kSum:
      return a + b;
    case ReduceOp::kProduct:
      return a * b;
    case ReduceOp::kMin:
      return std::min(a, b);
    case ReduceOp::kMax:
      return std::max(a, b);
    default:
      ADD_FAILURE() << "unexpected op";
      return a;
  }
}

template <typename T, typename Fn>
Bytes ReduceAs(const std::vector<Bytes>& inputs, Fn fn) {
  std::vector<T> acc = AsVector<T>(inputs[0]);
  for (size_t r = 1; r < inputs.size(); ++r) {
    const std::vector<T> in = AsVector<T>(inputs[r]);
    for (size_t i = 0; i < acc.size(); ++i) acc[i] = fn(acc[i], in[i]);
  }
  return AsBytes(acc);
}

// Rank-order reduction; the inputs make it exact, so the ring's order must give the same bits.
Bytes Reference(DataType dtype, ReduceOp op, const std::vector<Bytes>& inputs) {
  switch (dtype) {
    case DataType::kUint8:
      return ReduceAs<uint8_t>(inputs, [op](auto a, auto b) { return ReduceIntegers(op, a, b); });
    case DataType::kInt8:
      return ReduceAs<int8_t>(inputs, [op](auto a, auto b) { return ReduceIntegers(op, a, b); });
    case DataType::kInt32:
      return ReduceAs<int32_t>(inputs, [op](auto a, auto b) { return ReduceIntegers(op, a, b); });
    case DataType::kInt64:
      return ReduceAs<int64_t>(inputs, [op](auto a, auto b) { return ReduceIntegers(op, a, b); });
    case DataType::kFloat32:
      return ReduceAs<float>(inputs, [op](auto a, auto b) { return ReduceFloats(op, a, b); });
    case DataType::kFloat64:
      return ReduceAs<double>(inputs, [op](auto a, auto b) { return ReduceFloats(op, a, b); });
    case DataType::kFloat16:
    case DataType::kBfloat16:
      return ReduceAs<uint16_t>(inputs, [op, dtype](uint16_t a, uint16_t b) {
        return Narrow(dtype, ReduceFloats(op, Widen(dtype, a), Widen(dtype, b)));
      });
    default:
      ADD_FAILURE() << "unexpected dtype";
      return {};
  }
}

// "" when equal, else where and how the first element differs.
std::string FirstDifference(const Bytes& got, const Bytes& want, int element_size) {
  if (got.size() != want.size()) return absl::StrCat("size ", got.size(), " vs ", want.size());
  for (size_t i = 0; i < got.size(); i += element_size) {
    if (std::memcmp(&got[i], &want[i], element_size) != 0) {
      uint64_t g = 0, w = 0;
      std::memcpy(&g, &got[i], element_size);
      std::memcpy(&w, &want[i], element_size);
      return absl::StrCat("element ", i / element_size, ": got bits 0x", absl::Hex(g), ", want 0x",
                          absl::Hex(w));
    }
  }
  return "";
}

constexpr DataType kAllTypes[] = {DataType::kUint8,   DataType::kInt8,    DataType::kInt32,
                                  DataType::kInt64,   DataType::kFloat16, DataType::kBfloat16,
                                  DataType::kFloat32, DataType::kFloat64};
constexpr ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct};
constexpr int64_t kCounts[] = {1, 7, 1000, 1 << 18};

class GlooAllreduceTest : public testing::TestWithParam<std::tuple<int, DataType>> {};

TEST_P(GlooAllreduceTest, EveryOpAndCountMatchesReference) {
  const auto [np, dtype] = GetParam();
  struct Case {
    ReduceOp op;
    int64_t count;
    std::vector<Bytes> inputs;
    Bytes expected;
  };
  std::vector<Case> cases;
  std::mt19937_64 rng(1000 * np + static_cast<int>(dtype));
  for (ReduceOp op : kAllOps) {
    for (int64_t count : kCounts) {
      Case c{op, count, {}, {}};
      for (int r = 0; r < np; ++r) c.inputs.push_back(Generate(dtype, op, count, rng));
      c.expected = Reference(dtype, op, c.inputs);
      cases.push_back(std::move(c));
    }
  }

  RunRanks(np, [&](Backend& backend) {
    for (const Case& c : cases) {
      SCOPED_TRACE(
          absl::StrCat("rank ", backend.rank(), ", ", ReduceOpName(c.op), ", count ", c.count));
      Bytes data = c.inputs[backend.rank()];
      ASSERT_TRUE(backend.Allreduce(data.data(), c.count, dtype, c.op).ok());
      EXPECT_EQ(FirstDifference(data, c.expected, DataTypeSize(dtype)), "");
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, GlooAllreduceTest,
                         testing::Combine(testing::Values(2, 4), testing::ValuesIn(kAllTypes)),
                         [](const testing::TestParamInfo<std::tuple<int, DataType>>& info) {
                           return absl::StrCat("np", std::get<0>(info.param), "_",
                                               DataTypeName(std::get<1>(info.param)));
                         });

// Fractional 16-bit sums: every step rounds to 16 bits, so the result depends on the ring's order.
// With two ranks there is one step, a commutative one: exactly the float32 sum rounded back. With
// more, each of the np - 1 steps rounds (through float32) to within half an ulp of its partial sum,
// whose magnitude is at most sum(|x|).
class GlooHalfSumTest : public testing::TestWithParam<std::tuple<int, DataType>> {};

TEST_P(GlooHalfSumTest, FractionalSumWithinRoundingBound) {
  const auto [np, dtype] = GetParam();
  constexpr int64_t kCount = 4096;
  std::mt19937_64 rng(7 * np + static_cast<int>(dtype));
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<std::vector<uint16_t>> inputs(np, std::vector<uint16_t>(kCount));
  for (auto& input : inputs) {
    for (uint16_t& v : input) v = Narrow(dtype, uniform(rng));
  }
  std::vector<std::vector<uint16_t>> outputs = inputs;

  RunRanks(np, [&](Backend& backend) {
    std::vector<uint16_t>& data = outputs[backend.rank()];
    ASSERT_TRUE(backend.Allreduce(data.data(), kCount, dtype, ReduceOp::kSum).ok());
  });

  for (int64_t i = 0; i < kCount; ++i) {
    for (int r = 0; r < np; ++r) {
      ASSERT_EQ(outputs[r][i], outputs[0][i]) << "ranks disagree at element " << i;
    }
    if (np == 2) {
      ASSERT_EQ(outputs[0][i],
                Narrow(dtype, Widen(dtype, inputs[0][i]) + Widen(dtype, inputs[1][i])))
          << "element " << i;
      continue;
    }
    double exact = 0, magnitude = 0;
    for (int r = 0; r < np; ++r) {
      exact += Widen(dtype, inputs[r][i]);
      magnitude += std::fabs(Widen(dtype, inputs[r][i]));
    }
    const uint16_t top = Narrow(dtype, static_cast<float>(magnitude));
    const double ulp = Widen(dtype, top + 1) - Widen(dtype, top);
    // Half an ulp per 16-bit rounding, plus float32's own rounding before it (2^-24 relative).
    const double bound = (np - 1) * (0.5 * ulp + magnitude * 0x1p-24);
    ASSERT_LE(std::fabs(Widen(dtype, outputs[0][i]) - exact), bound) << "element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, GlooHalfSumTest,
                         testing::Combine(testing::Values(2, 4),
                                          testing::Values(DataType::kFloat16, DataType::kBfloat16)),
                         [](const testing::TestParamInfo<std::tuple<int, DataType>>& info) {
                           return absl::StrCat("np", std::get<0>(info.param), "_",
                                               DataTypeName(std::get<1>(info.param)));
                         });

// ---- Broadcast, allgatherv, barrier ----

class GlooCollectivesTest : public testing::TestWithParam<int> {};

TEST_P(GlooCollectivesTest, BroadcastFromEveryRoot) {
  const int np = GetParam();
  for (int64_t bytes : {int64_t{1}, int64_t{1000}, int64_t{300'007}}) {
    // Each root broadcasts its own pattern; the others start with junk of their own.
    auto pattern = [bytes](int rank) {
      Bytes b(bytes);
      for (int64_t i = 0; i < bytes; ++i) b[i] = static_cast<uint8_t>(i * 7 + rank * 13 + 1);
      return b;
    };
    RunRanks(np, [&](Backend& backend) {
      for (int root = 0; root < np; ++root) {
        SCOPED_TRACE(absl::StrCat("rank ", backend.rank(), ", root ", root, ", ", bytes, " bytes"));
        Bytes data = pattern(backend.rank());
        ASSERT_TRUE(backend.Broadcast(data.data(), bytes, root).ok());
        EXPECT_TRUE(data == pattern(root));
      }
      // Zero bytes is a no-op.
      EXPECT_TRUE(backend.Broadcast(nullptr, 0, 0).ok());
    });
  }
}

TEST_P(GlooCollectivesTest, AllgathervConcatenatesInRankOrder) {
  const int np = GetParam();
  const std::vector<std::vector<int64_t>> layouts =
      np == 2
          ? std::vector<std::vector<int64_t>>{{0, 7}, {5, 0}, {1000, 3}, {0, 0}, {65'536, 65'537}}
          : std::vector<std::vector<int64_t>>{
                {0, 5, 1000, 3}, {7, 0, 0, 0}, {0, 0, 0, 1}, {0, 0, 0, 0}, {100'000, 1, 0, 77}};
  auto part = [](int rank, int64_t bytes) {
    Bytes b(bytes);
    for (int64_t i = 0; i < bytes; ++i) b[i] = static_cast<uint8_t>(rank * 41 + i * 3 + 5);
    return b;
  };
  RunRanks(np, [&](Backend& backend) {
    for (const std::vector<int64_t>& sizes : layouts) {
      SCOPED_TRACE(absl::StrCat("rank ", backend.rank(), ", sizes ", ShapeString(sizes)));
      Bytes expected;
      for (int r = 0; r < np; ++r) {
        Bytes p = part(r, sizes[r]);
        expected.insert(expected.end(), p.begin(), p.end());
      }
      const Bytes in = part(backend.rank(), sizes[backend.rank()]);
      Bytes out(expected.size(), 0xEE);
      ASSERT_TRUE(backend.Allgatherv(in.data(), out.data(), sizes).ok());
      EXPECT_TRUE(out == expected);
    }
  });
}

TEST_P(GlooCollectivesTest, BarrierHoldsEveryRankUntilAllArrive) {
  const int np = GetParam();
  constexpr int kRounds = 5;
  std::atomic<int> arrived{0};
  RunRanks(np, [&](Backend& backend) {
    for (int round = 1; round <= kRounds; ++round) {
      // The last rank to arrive is late on purpose; nobody may leave before it has arrived.
      if (backend.rank() == (round % np)) absl::SleepFor(absl::Milliseconds(20));
      arrived.fetch_add(1);
      ASSERT_TRUE(backend.Barrier().ok());
      EXPECT_GE(arrived.load(), round * np) << "rank " << backend.rank() << " round " << round;
      // A second barrier keeps the next round's increments from racing this round's check.
      ASSERT_TRUE(backend.Barrier().ok());
    }
  });
}

TEST_P(GlooCollectivesTest, MixedSequenceKeepsOperationsApart) {
  const int np = GetParam();
  RunRanks(np, [&](Backend& backend) {
    for (int i = 0; i < 20; ++i) {
      int64_t value = backend.rank() + i;
      ASSERT_TRUE(backend.Allreduce(&value, 1, DataType::kInt64, ReduceOp::kSum).ok());
      EXPECT_EQ(value, np * (np - 1) / 2 + np * i);
      int32_t root_value = backend.rank() == i % np ? 1000 + i : -1;
      ASSERT_TRUE(backend.Broadcast(&root_value, sizeof(root_value), i % np).ok());
      EXPECT_EQ(root_value, 1000 + i);
      std::vector<int64_t> sizes(np, 1);
      const uint8_t mine = static_cast<uint8_t>(backend.rank() + i);
      std::vector<uint8_t> all(np);
      ASSERT_TRUE(backend.Allgatherv(&mine, all.data(), sizes).ok());
      for (int r = 0; r < np; ++r) EXPECT_EQ(all[r], r + i);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, GlooCollectivesTest, testing::Values(2, 4), NpName);

// ---- Arguments and a single rank ----

TEST(GlooBackendTest, SingleRankNeedsNoPeers) {
  RunRanks(1, [](Backend& backend) {
    std::vector<float> data = {1.5f, -2.0f};
    ASSERT_TRUE(backend.Allreduce(data.data(), 2, DataType::kFloat32, ReduceOp::kSum).ok());
    EXPECT_THAT(data, ElementsAre(1.5f, -2.0f));
    uint8_t byte = 9;
    ASSERT_TRUE(backend.Broadcast(&byte, 1, 0).ok());
    uint8_t out = 0;
    const int64_t sizes[] = {1};
    ASSERT_TRUE(backend.Allgatherv(&byte, &out, sizes).ok());
    EXPECT_EQ(out, 9);
    ASSERT_TRUE(backend.Barrier().ok());
  });
}

TEST(GlooBackendTest, RejectsBadArgumentsWithoutCommunicating) {
  RunRanks(2, [](Backend& backend) {
    float x = 1;
    for (ReduceOp op : {ReduceOp::kAverage, ReduceOp::kUnspecified}) {
      const absl::Status status = backend.Allreduce(&x, 1, DataType::kFloat32, op);
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    }
    EXPECT_EQ(backend.Allreduce(&x, 1, DataType::kUnspecified, ReduceOp::kSum).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(backend.Allreduce(&x, -1, DataType::kFloat32, ReduceOp::kSum).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(backend.Broadcast(&x, 4, 2).code(), absl::StatusCode::kInvalidArgument);
    const int64_t one_size[] = {4};
    EXPECT_EQ(backend.Allgatherv(&x, &x, one_size).code(), absl::StatusCode::kInvalidArgument);
    // Zero elements is a no-op, and none of the above broke the communicator.
    EXPECT_TRUE(backend.Allreduce(nullptr, 0, DataType::kFloat32, ReduceOp::kSum).ok());
    x = static_cast<float>(backend.rank() + 1);
    ASSERT_TRUE(backend.Allreduce(&x, 1, DataType::kFloat32, ReduceOp::kMax).ok());
    EXPECT_EQ(x, 2.0f);
  });
}

TEST(GlooBackendTest, RejectsBadOptions) {
  auto store = KeyValueStore::InMemory();
  EXPECT_EQ(CreateGlooBackend(Options(2, 2, store)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateGlooBackend(Options(-1, 2, store)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateGlooBackend(Options(0, 1, nullptr)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateGlooBackend(Options(0, 1, store, absl::ZeroDuration())).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GlooBackendTest, ListensOnANamedInterface) {
  auto store = KeyValueStore::InMemory();
  GlooBackendOptions options = Options(0, 1, store);
  options.iface = "lo";
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateGlooBackend(options);
  ASSERT_TRUE(backend.ok()) << backend.status();
  options.iface = "no-such-interface0";
  const absl::Status status = CreateGlooBackend(options).status();
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("no-such-interface0"));
}

// ---- Failures: every one returns a status within its deadline ----

TEST(GlooBackendTest, RendezvousTimesOutWhenARankNeverShowsUp) {
  auto store = KeyValueStore::InMemory();
  const absl::Time start = absl::Now();
  const absl::Status status = CreateGlooBackend(Options(0, 2, store, absl::Seconds(1))).status();
  const absl::Duration elapsed = absl::Now() - start;
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(status.message(), HasSubstr("rank 0"));
  EXPECT_THAT(status.message(), HasSubstr("gloo/1"));  // The missing rank's key.
  EXPECT_GE(elapsed, absl::Milliseconds(900));
  EXPECT_LT(elapsed, absl::Seconds(5));
}

// Connects two ranks with `timeout`, each on its own thread; returns both backends.
std::vector<std::unique_ptr<Backend>> ConnectPair(absl::Duration timeout) {
  auto store = KeyValueStore::InMemory();
  std::vector<std::unique_ptr<Backend>> backends(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      auto backend = CreateGlooBackend(Options(rank, 2, store, timeout));
      ASSERT_TRUE(backend.ok()) << backend.status();
      backends[rank] = *std::move(backend);
    });
  }
  for (std::thread& thread : threads) thread.join();
  return backends;
}

TEST(GlooBackendTest, CollectiveTimesOutWhenAPeerDoesNotJoin) {
  std::vector<std::unique_ptr<Backend>> backends = ConnectPair(absl::Seconds(1));
  ASSERT_NE(backends[0], nullptr);
  ASSERT_NE(backends[1], nullptr);
  std::vector<float> data(1000, 1.0f);
  const absl::Time start = absl::Now();
  const absl::Status status =
      backends[0]->Allreduce(data.data(), 1000, DataType::kFloat32, ReduceOp::kSum);
  const absl::Duration elapsed = absl::Now() - start;
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(status.message(), HasSubstr("gloo allreduce failed on rank 0"));
  EXPECT_GE(elapsed, absl::Milliseconds(900));
  EXPECT_LT(elapsed, absl::Seconds(5));
  // The communicator is spent; later calls say so instead of touching closed pairs.
  const absl::Status again = backends[0]->Barrier();
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
  EXPECT_THAT(again.message(), HasSubstr("earlier failure"));
}

TEST(GlooBackendTest, PeerThatDisappearsFailsTheCollective) {
  std::vector<std::unique_ptr<Backend>> backends = ConnectPair(absl::Seconds(2));
  ASSERT_NE(backends[0], nullptr);
  ASSERT_NE(backends[1], nullptr);
  // Prove the pair works, then lose rank 1.
  std::thread peer([&] {
    int32_t x = 1;
    EXPECT_TRUE(backends[1]->Allreduce(&x, 1, DataType::kInt32, ReduceOp::kSum).ok());
  });
  int32_t x = 1;
  ASSERT_TRUE(backends[0]->Allreduce(&x, 1, DataType::kInt32, ReduceOp::kSum).ok());
  peer.join();
  EXPECT_EQ(x, 2);
  backends[1].reset();

  std::vector<float> data(1 << 16, 1.0f);
  const absl::Time start = absl::Now();
  const absl::Status status =
      backends[0]->Allreduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum);
  const absl::Duration elapsed = absl::Now() - start;
  EXPECT_THAT(status.code(),
              AnyOf(absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded))
      << status;
  EXPECT_THAT(status.message(), HasSubstr("gloo allreduce failed on rank 0"));
  EXPECT_LT(elapsed, absl::Seconds(5));
}

// ---- The in-memory rendezvous store ----

TEST(InMemoryKeyValueStoreTest, SetGetAndNotFound) {
  auto store = KeyValueStore::InMemory();
  ASSERT_TRUE(store->Set("a", "1").ok());
  EXPECT_EQ(store->Get("a").value(), "1");
  ASSERT_TRUE(store->Set("a", "2").ok());
  EXPECT_EQ(store->Get("a").value(), "2");
  EXPECT_EQ(store->Get("b").status().code(), absl::StatusCode::kNotFound);
}

TEST(InMemoryKeyValueStoreTest, WaitReturnsValuesInKeyOrderOnceAllAreSet) {
  auto store = KeyValueStore::InMemory();
  ASSERT_TRUE(store->Set("b", "2").ok());
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(20));
    ASSERT_TRUE(store->Set("a", "1").ok());
  });
  absl::StatusOr<std::vector<std::string>> values = store->Wait({"a", "b"}, kTimeout);
  setter.join();
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(*values, ElementsAre("1", "2"));
}

TEST(InMemoryKeyValueStoreTest, WaitTimesOutNamingMissingKeysInOrder) {
  auto store = KeyValueStore::InMemory();
  ASSERT_TRUE(store->Set("b", "2").ok());
  const absl::Status status = store->Wait({"c", "b", "a"}, absl::Milliseconds(50)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(status.message(), "rendezvous wait timed out; keys not set: c, a");
}

}  // namespace
}  // namespace ringmaster
