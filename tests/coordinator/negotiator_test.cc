#include "coordinator/negotiator.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::SizeIs;

// ---- Requests ----

TensorRequest Allreduce(std::string name, std::vector<int64_t> shape = {4},
                        DataType dtype = DataType::kFloat32) {
  TensorRequest r;
  r.name = std::move(name);
  r.type = RequestType::kAllreduce;
  r.dtype = dtype;
  r.shape = std::move(shape);
  return r;
}

TensorRequest Allgather(std::string name, std::vector<int64_t> shape,
                        DataType dtype = DataType::kFloat32) {
  TensorRequest r = Allreduce(std::move(name), std::move(shape), dtype);
  r.type = RequestType::kAllgather;
  return r;
}

TensorRequest Broadcast(std::string name, int32_t root, std::vector<int64_t> shape = {4}) {
  TensorRequest r = Allreduce(std::move(name), std::move(shape));
  r.type = RequestType::kBroadcast;
  r.root_rank = root;
  return r;
}

TensorRequest Bytes(std::string name, int64_t n) {  // uint8: one element is one byte
  return Allreduce(std::move(name), {n}, DataType::kUint8);
}

TensorRequest Grouped(TensorRequest r, int32_t group_id, int32_t group_size) {
  r.group_id = group_id;
  r.group_size = group_size;
  return r;
}

TensorRequest JoinRequest() {
  TensorRequest r;
  r.name = "join";
  r.type = RequestType::kJoin;
  return r;
}

// ---- Outputs ----

std::vector<std::vector<std::string>> Names(const CycleOutput& out) {
  std::vector<std::vector<std::string>> names;
  for (const Response& r : out.responses) names.push_back(r.names);
  return names;
}

std::vector<std::vector<uint32_t>> CacheIds(const CycleOutput& out) {
  std::vector<std::vector<uint32_t>> ids;
  for (const Response& r : out.responses) ids.push_back(r.cache_ids);
  return ids;
}

std::vector<std::pair<std::string, uint32_t>> Assignments(const CycleOutput& out) {
  std::vector<std::pair<std::string, uint32_t>> a;
  for (const CacheAssignment& c : out.cache_assignments) a.emplace_back(c.name, c.id);
  return a;
}

bool NoNotices(const CycleOutput& out) {
  return std::all_of(out.notices.begin(), out.notices.end(),
                     [](const RankNotice& n) { return n.empty(); });
}

// ---- Fixture ----

class NegotiatorTest : public ::testing::Test {
 protected:
  // Defaults chosen so most tests see plain names: no cache, a large fusion buffer, 1 ms cycles.
  static NegotiatorOptions Options(int ranks) {
    NegotiatorOptions o;
    o.job_id = "job-000001";
    const char* hosts[] = {"node-a", "node-b", "node-c", "node-d"};
    for (int r = 0; r < ranks; ++r) o.rank_hosts.push_back(hosts[r]);
    o.fusion_threshold_bytes = int64_t{128} << 20;
    o.cycle_time = absl::Milliseconds(1);
    o.cache_capacity = 0;
    o.stall_check = absl::Seconds(60);
    o.stall_shutdown = absl::ZeroDuration();
    return o;
  }

  void Submit(Negotiator& n, int rank, std::vector<TensorRequest> requests,
              std::vector<uint32_t> ids = {}) {
    n.Submit(rank, std::move(requests), ids, clock_.Now());
  }
  std::optional<CycleOutput> Poll(Negotiator& n) { return n.Poll(clock_.Now()); }

  // Two ranks and a cache of two entries, holding a (id 1) and b (id 2), a the older.
  std::unique_ptr<Negotiator> TwoCachedOfTwo() {
    NegotiatorOptions o = Options(2);
    o.cache_capacity = 2;
    auto n = std::make_unique<Negotiator>(o);
    for (int rank : {0, 1}) Submit(*n, rank, {Allreduce("a"), Allreduce("b")});
    std::optional<CycleOutput> out = Poll(*n);
    EXPECT_TRUE(out.has_value());
    if (out.has_value()) {
      EXPECT_THAT(Assignments(*out), ElementsAre(std::pair<std::string, uint32_t>("a", 1),
                                                 std::pair<std::string, uint32_t>("b", 2)));
    }
    return n;
  }

  FakeClock clock_;
};

// ---- Readiness and order ----

TEST_F(NegotiatorTest, TensorIsReadyOnlyWhenEveryRankSubmittedIt) {
  Negotiator n(Options(3));
  EXPECT_EQ(n.size(), 3);
  Submit(n, 0, {Allreduce("a")});
  EXPECT_EQ(Poll(n), std::nullopt);
  Submit(n, 2, {Allreduce("a")});
  EXPECT_EQ(Poll(n), std::nullopt);
  EXPECT_EQ(n.NextDeadline(), absl::InfiniteFuture());
  clock_.Advance(absl::Hours(1));  // time alone never makes a partial tensor ready
  EXPECT_EQ(Poll(n), std::nullopt);

  Submit(n, 1, {Allreduce("a")});
  EXPECT_EQ(n.NextDeadline(), absl::InfinitePast());
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  ASSERT_THAT(out->responses, SizeIs(1));
  const Response& r = out->responses[0];
  EXPECT_EQ(r.type, Response::Type::kAllreduce);
  EXPECT_THAT(r.names, ElementsAre("a"));
  EXPECT_THAT(r.cache_ids, ElementsAre(0u));
  EXPECT_EQ(r.dtype, DataType::kFloat32);
  EXPECT_EQ(r.reduce_op, ReduceOp::kAverage);
  EXPECT_EQ(r.prescale_factor, 1.0);
  EXPECT_EQ(r.postscale_factor, 1.0);
  EXPECT_EQ(r.device, -1);
  EXPECT_THAT(r.tensor_sizes, ElementsAre(4));
  EXPECT_EQ(r.error_message, "");
  EXPECT_THAT(out->notices, SizeIs(3));
  EXPECT_TRUE(NoNotices(*out));
  EXPECT_THAT(out->cache_assignments, IsEmpty());
  EXPECT_THAT(out->evicted_ids, IsEmpty());

  // Nothing is left: the next poll has nothing to say.
  EXPECT_EQ(Poll(n), std::nullopt);
  EXPECT_EQ(n.NextDeadline(), absl::InfiniteFuture());
}

TEST_F(NegotiatorTest, OrderFollowsReadinessNotSubmissionOrder) {
  NegotiatorOptions o = Options(2);
  o.fusion_threshold_bytes = 0;  // one response per tensor, so the order is visible
  Negotiator n(o);
  Submit(n, 0, {Allreduce("a"), Allreduce("b"), Allreduce("c")});
  Submit(n, 1, {Allreduce("c"), Allreduce("a"), Allreduce("b")});
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(Names(*out), ElementsAre(ElementsAre("c"), ElementsAre("a"), ElementsAre("b")));
}

TEST_F(NegotiatorTest, FusedResponseKeepsReadinessOrderForEveryPermutation) {
  std::vector<std::string> order = {"a", "b", "c"};
  do {
    SCOPED_TRACE(absl::StrCat(order[0], order[1], order[2]));
    Negotiator n(Options(2));
    Submit(n, 0, {Allreduce("a"), Allreduce("b"), Allreduce("c")});
    Submit(n, 1, {Allreduce(order[0]), Allreduce(order[1]), Allreduce(order[2])});
    std::optional<CycleOutput> out = Poll(n);
    ASSERT_TRUE(out.has_value());
    ASSERT_THAT(out->responses, SizeIs(1));
    EXPECT_EQ(out->responses[0].names, order);
    EXPECT_THAT(out->responses[0].tensor_sizes, ElementsAre(4, 4, 4));
  } while (std::next_permutation(order.begin(), order.end()));
}

TEST_F(NegotiatorTest, SeparateBatchesAreOrderedByWhenEachTensorBecameReady) {
  Negotiator n(Options(2));
  Submit(n, 0, {Allreduce("a")});
  Submit(n, 0, {Allreduce("b")});
  Submit(n, 1, {Allreduce("b")});  // b ready; a still waits for rank 1
  EXPECT_EQ(Poll(n), std::nullopt);
  Submit(n, 1, {Allreduce("a")});
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(Names(*out), ElementsAre(ElementsAre("b", "a")));
}

// ---- Fusion ----

TEST_F(NegotiatorTest, TensorsTotallingExactlyTheThresholdFuse) {
  NegotiatorOptions o = Options(2);
  o.fusion_threshold_bytes = 32;
  Negotiator n(o);
  for (int rank : {0, 1}) Submit(n, rank, {Bytes("a", 16), Bytes("b", 16)});
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  ASSERT_THAT(out->responses, SizeIs(1));
  EXPECT_THAT(out->responses[0].names, ElementsAre("a", "b"));
  EXPECT_THAT(out->responses[0].tensor_sizes, ElementsAre(16, 16));
  EXPECT_EQ(out->responses[0].dtype, DataType::kUint8);
}

TEST_F(NegotiatorTest, OneByteOverTheThresholdSplits) {
  NegotiatorOptions o = Options(2);
  o.fusion_threshold_bytes = 32;
  Negotiator n(o);
  for (int rank : {0, 1}) Submit(n, rank, {Bytes("a", 16), Bytes("b", 17)});
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(Names(*out), ElementsAre(ElementsAre("a"), ElementsAre("b")));
  EXPECT_THAT(out->responses[1].tensor_sizes, ElementsAre(17));
}

TEST_F(NegotiatorTest, ThresholdIsCountedInBytesNotElements) {
  NegotiatorOptions o = Options(2);
  o.fusion_threshold_bytes = 32;
  Negotiator n(o);
  // float64 [2] is 16 bytes: two fit exactly; a third does not.
  for (int rank : {0, 1}) {
    Submit(n, rank,
           {Allreduce("a", {2}, DataType::kFloat64), Allreduce("b", {2}, DataType::kFloat64),
            Allreduce("c", {2}, DataType::kFloat64)});
  }
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(Names(*out), ElementsAre(ElementsAre("a", "b"), ElementsAre("c")));
}

TEST_F(NegotiatorTest, ThresholdZeroGivesOneResponsePerTensor) {
  NegotiatorOptions o = Options(2);
  o.fusion_threshold_bytes = 0;
  Negotiator n(o);
  for (int rank : {0, 1}) Submit(n, rank, {Bytes("a", 1), Bytes("b", 1), Bytes("c", 1)});
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(Names(*out), ElementsAre(ElementsAre("a"), ElementsAre("b"), ElementsAre("c")));
}

TEST_F(NegotiatorTest, TensorLargerThanTheThresholdGoesAloneAndLaterOnesStillFuse) {
  NegotiatorOptions o = Options(2);
  o.fusion_threshold_bytes = 32;
  Negotiator n(o);
  for (int rank : {0, 1}) Submit(n, rank, {Bytes("big", 40), Bytes("b", 16), Bytes("c", 16)});
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(Names(*out), ElementsAre(ElementsAre("big"), ElementsAre("b", "c")));
}

TEST_F(NegotiatorTest, FusionStopsAtTheFirstTensorThatDoesNotFitInsteadOfReachingPastIt) {
  // Horovod's look-ahead: a later small tensor does not jump over one that overflows the buffer, so
  // tensors laid out back to back in memory fuse into contiguous runs.
  NegotiatorOptions o = Options(2);
  o.fusion_threshold_bytes = 100;
  Negotiator n(o);
  for (int rank : {0, 1}) Submit(n, rank, {Bytes("a", 60), Bytes("b", 60), Bytes("c", 10)});
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(Names(*out), ElementsAre(ElementsAre("a"), ElementsAre("b", "c")));
}

TEST_F(NegotiatorTest, IncompatibleTensorInBetweenIsPassedOverAndKeepsItsPlace) {
  Negotiator n(Options(2));
  for (int rank : {0, 1}) {
    Submit(n, rank,
           {Allreduce("a"), Allreduce("d", {4}, DataType::kFloat64), Allreduce("c"),
            Allreduce("e", {4}, DataType::kFloat64)});
  }
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(Names(*out), ElementsAre(ElementsAre("a", "c"), ElementsAre("d", "e")));
  EXPECT_EQ(out->responses[0].dtype, DataType::kFloat32);
  EXPECT_EQ(out->responses[1].dtype, DataType::kFloat64);
}

struct FusionCase {
  std::string label;
  TensorRequest second;  // fused with Allreduce("a") only when compatible
  int responses;
};

class FusionCompatibilityTest : public NegotiatorTest,
                                public ::testing::WithParamInterface<FusionCase> {};

TEST_P(FusionCompatibilityTest, OnlyCompatibleTensorsFuse) {
  Negotiator n(Options(2));
  for (int rank : {0, 1}) Submit(n, rank, {Allreduce("a"), GetParam().second});
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  ASSERT_THAT(out->responses, SizeIs(GetParam().responses));
  if (GetParam().responses == 1) {
    EXPECT_THAT(out->responses[0].names, ElementsAre("a", "b"));
  } else {
    EXPECT_THAT(Names(*out), ElementsAre(ElementsAre("a"), ElementsAre("b")));
  }
}

FusionCase WithChange(std::string label, void (*change)(TensorRequest&), int responses) {
  TensorRequest b = Allreduce("b");
  change(b);
  return FusionCase{std::move(label), b, responses};
}

INSTANTIATE_TEST_SUITE_P(
    Negotiator, FusionCompatibilityTest,
    ::testing::Values(WithChange(
                          "Identical", [](TensorRequest&) {}, 1),
                      WithChange(
                          "OtherShape",
                          [](TensorRequest& r) {
                            r.shape = {2, 7};
                          },
                          1),
                      WithChange(
                          "UnspecifiedOpMeansAverage",
                          [](TensorRequest& r) { r.reduce_op = ReduceOp::kUnspecified; }, 1),
                      WithChange(
                          "Dtype", [](TensorRequest& r) { r.dtype = DataType::kFloat64; }, 2),
                      WithChange(
                          "Type", [](TensorRequest& r) { r.type = RequestType::kAllgather; }, 2),
                      WithChange(
                          "Device", [](TensorRequest& r) { r.device = 0; }, 2),
                      WithChange(
                          "ReduceOp", [](TensorRequest& r) { r.reduce_op = ReduceOp::kSum; }, 2),
                      WithChange(
                          "Prescale", [](TensorRequest& r) { r.prescale_factor = 0.5; }, 2),
                      WithChange(
                          "Postscale", [](TensorRequest& r) { r.postscale_factor = 0.5; }, 2)),
    [](const ::testing::TestParamInfo<FusionCase>& info) { return info.param.label; });

TEST_F(NegotiatorTest, BroadcastsNeverFuse) {
  Negotiator n(Options(2));
  for (int rank : {0, 1}) Submit(n, rank, {Broadcast("a", 0), Broadcast("b", 0)});
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(Names(*out), ElementsAre(ElementsAre("a"), ElementsAre("b")));
  EXPECT_EQ(out->responses[0].type, Response::Type::kBroadcast);
  EXPECT_EQ(out->responses[0].root_rank, 0);
}

TEST_F(NegotiatorTest, AllgatherTensorSizesHoldEachRanksFirstDimension) {
  Negotiator n(Options(3));
  Submit(n, 0, {Allgather("g", {1, 5}), Allgather("h", {4})});
  Submit(n, 1, {Allgather("g", {2, 5}), Allgather("h", {5})});
  Submit(n, 2, {Allgather("g", {3, 5}), Allgather("h", {0})});
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  ASSERT_THAT(out->responses, SizeIs(1));
  EXPECT_EQ(out->responses[0].type, Response::Type::kAllgather);
  EXPECT_THAT(out->responses[0].names, ElementsAre("g", "h"));
  // Tensor t on rank r at t * size + r.
  EXPECT_THAT(out->responses[0].tensor_sizes, ElementsAre(1, 2, 3, 4, 5, 0));
  // Elements per row of each tensor: what a joined rank (no shape of its own) moves per row.
  EXPECT_THAT(out->responses[0].row_elements, ElementsAre(5, 1));
}

TEST_F(NegotiatorTest, AllgatherBytesCountEveryRanksRows) {
  NegotiatorOptions o = Options(2);
  o.fusion_threshold_bytes = 40;
  Negotiator n(o);
  // g: (1 + 2) rows x 4 float32 = 48 bytes > 40, so h cannot join it.
  Submit(n, 0, {Allgather("g", {1, 4}), Allgather("h", {1})});
  Submit(n, 1, {Allgather("g", {2, 4}), Allgather("h", {1})});
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(Names(*out), ElementsAre(ElementsAre("g"), ElementsAre("h")));
}

// ---- Groups ----

TEST_F(NegotiatorTest, GroupLeavesInOneResponseEvenOverTheThreshold) {
  NegotiatorOptions o = Options(2);
  o.fusion_threshold_bytes = 16;
  Negotiator n(o);
  // Three 16-byte members: 48 bytes in a 16-byte buffer; plus one ungrouped tensor.
  for (int rank : {0, 1}) {
    Submit(n, rank,
           {Grouped(Allreduce("g0"), 7, 3), Allreduce("x"), Grouped(Allreduce("g1"), 7, 3),
            Grouped(Allreduce("g2"), 7, 3)});
  }
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(Names(*out), ElementsAre(ElementsAre("x"), ElementsAre("g0", "g1", "g2")));
  EXPECT_THAT(out->responses[1].tensor_sizes, ElementsAre(4, 4, 4));
}

TEST_F(NegotiatorTest, GroupWaitsForAllItsMembers) {
  Negotiator n(Options(2));
  for (int rank : {0, 1}) Submit(n, rank, {Grouped(Allreduce("g0"), 3, 2)});
  Submit(n, 0, {Grouped(Allreduce("g1"), 3, 2)});
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(Poll(n), std::nullopt);
  Submit(n, 1, {Grouped(Allreduce("g1"), 3, 2)});
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(Names(*out), ElementsAre(ElementsAre("g0", "g1")));
}

TEST_F(NegotiatorTest, GroupMembersDoNotFuseWithOtherTensors) {
  Negotiator n(Options(2));
  for (int rank : {0, 1}) {
    Submit(n, rank, {Allreduce("x"), Grouped(Allreduce("g0"), 1, 1), Allreduce("y")});
  }
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(Names(*out), ElementsAre(ElementsAre("x", "y"), ElementsAre("g0")));
}

// ---- Cycle time and deadlines ----

TEST_F(NegotiatorTest, ReadyTensorsWaitForTheCycleTimeWhileAnotherIsPartiallySubmitted) {
  NegotiatorOptions o = Options(2);
  o.cycle_time = absl::Milliseconds(5);
  Negotiator n(o);
  const absl::Time t0 = clock_.Now();
  Submit(n, 0, {Allreduce("a"), Allreduce("b")});
  Submit(n, 1, {Allreduce("a")});  // a ready at t0; b waits for rank 1
  EXPECT_EQ(n.NextDeadline(), t0 + absl::Milliseconds(5));
  EXPECT_EQ(Poll(n), std::nullopt);
  clock_.Advance(absl::Milliseconds(5) - absl::Nanoseconds(1));
  EXPECT_EQ(Poll(n), std::nullopt);
  clock_.Advance(absl::Nanoseconds(1));
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(Names(*out), ElementsAre(ElementsAre("a")));
  EXPECT_EQ(n.NextDeadline(), absl::InfiniteFuture());  // only the partial b remains

  // b completes: nothing else is partial, so it leaves at once.
  Submit(n, 1, {Allreduce("b")});
  EXPECT_EQ(n.NextDeadline(), absl::InfinitePast());
  out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(Names(*out), ElementsAre(ElementsAre("b")));
}

TEST_F(NegotiatorTest, CycleTimeCountsFromTheFirstReadyTensor) {
  NegotiatorOptions o = Options(2);
  o.cycle_time = absl::Milliseconds(5);
  Negotiator n(o);
  const absl::Time t0 = clock_.Now();
  Submit(n, 0, {Allreduce("a"), Allreduce("b"), Allreduce("p")});
  Submit(n, 1, {Allreduce("a")});
  clock_.Advance(absl::Milliseconds(3));
  Submit(n, 1, {Allreduce("b")});
  EXPECT_EQ(n.NextDeadline(), t0 + absl::Milliseconds(5));
  clock_.Advance(absl::Milliseconds(2));
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(Names(*out), ElementsAre(ElementsAre("a", "b")));
}

TEST_F(NegotiatorTest, FullFusionBufferLeavesWithoutWaitingForTheCycleTime) {
  NegotiatorOptions o = Options(2);
  o.fusion_threshold_bytes = 32;
  o.cycle_time = absl::Seconds(1);
  Negotiator n(o);
  Submit(n, 0, {Bytes("a", 16), Bytes("b", 16), Bytes("partial", 1)});
  Submit(n, 1, {Bytes("a", 16)});
  EXPECT_EQ(Poll(n), std::nullopt);  // 16 of 32 bytes
  Submit(n, 1, {Bytes("b", 16)});
  // 32 of 32 bytes: due now, whatever the cycle time.
  EXPECT_LE(n.NextDeadline(), clock_.Now());
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(Names(*out), ElementsAre(ElementsAre("a", "b")));
}

TEST_F(NegotiatorTest, SetParametersAppliesFromTheNextPoll) {
  NegotiatorOptions o = Options(2);
  o.fusion_threshold_bytes = 0;
  o.cycle_time = absl::Milliseconds(1);
  Negotiator n(o);
  n.SetParameters(1024, absl::Milliseconds(7));
  EXPECT_EQ(n.fusion_threshold_bytes(), 1024);
  EXPECT_EQ(n.cycle_time(), absl::Milliseconds(7));
  const absl::Time t0 = clock_.Now();
  Submit(n, 0, {Allreduce("a"), Allreduce("b"), Allreduce("p")});
  Submit(n, 1, {Allreduce("a"), Allreduce("b")});
  EXPECT_EQ(n.NextDeadline(), t0 + absl::Milliseconds(7));
  clock_.Advance(absl::Milliseconds(7));
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(Names(*out), ElementsAre(ElementsAre("a", "b")));
}

// ---- Response cache ----

TEST_F(NegotiatorTest, FirstCycleAssignsCacheIdsAndLaterSubmissionsByIdAreHits) {
  NegotiatorOptions o = Options(2);
  o.cache_capacity = 16;
  o.fusion_threshold_bytes = 0;
  Negotiator n(o);
  for (int rank : {0, 1}) Submit(n, rank, {Allreduce("a"), Allreduce("b")});
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  // Ids assigned this cycle travel with their names in cache_assignments, not in the responses.
  EXPECT_THAT(Assignments(*out), ElementsAre(std::pair<std::string, uint32_t>("a", 1),
                                             std::pair<std::string, uint32_t>("b", 2)));
  EXPECT_THAT(Names(*out), ElementsAre(ElementsAre(""), ElementsAre("")));
  EXPECT_THAT(CacheIds(*out), ElementsAre(ElementsAre(1u), ElementsAre(2u)));
  EXPECT_THAT(out->evicted_ids, IsEmpty());
  EXPECT_EQ(n.stats().cache_misses, 2);
  EXPECT_EQ(n.stats().cache_hits, 0);

  for (int rank : {0, 1}) Submit(n, rank, {}, {2, 1});
  out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(CacheIds(*out), ElementsAre(ElementsAre(2u), ElementsAre(1u)));
  EXPECT_THAT(Names(*out), ElementsAre(ElementsAre(""), ElementsAre("")));
  EXPECT_THAT(out->cache_assignments, IsEmpty());
  EXPECT_TRUE(NoNotices(*out));
  NegotiatorStats stats = n.stats();
  EXPECT_EQ(stats.cache_hits, 2);
  EXPECT_EQ(stats.cache_misses, 2);
  EXPECT_EQ(stats.requests, 8);
  EXPECT_EQ(stats.tensors_negotiated, 4);
  EXPECT_EQ(stats.cycles, 2);

  // One rank by id and the other in full: a hit when the id came first, and the id is kept.
  Submit(n, 0, {}, {1});
  Submit(n, 1, {Allreduce("a")});
  out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(CacheIds(*out), ElementsAre(ElementsAre(1u)));
  EXPECT_EQ(n.stats().cache_hits, 3);
  Submit(n, 0, {Allreduce("a")});
  Submit(n, 1, {}, {1});
  out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(CacheIds(*out), ElementsAre(ElementsAre(1u)));
  EXPECT_THAT(out->cache_assignments, IsEmpty());
  EXPECT_EQ(n.stats().cache_hits, 3);
  EXPECT_EQ(n.stats().cache_misses, 3);
}

TEST_F(NegotiatorTest, MetadataChangeInvalidatesTheCachedId) {
  NegotiatorOptions o = Options(2);
  o.cache_capacity = 16;
  Negotiator n(o);
  for (int rank : {0, 1}) Submit(n, rank, {Allreduce("a", {4})});
  ASSERT_TRUE(Poll(n).has_value());

  for (int rank : {0, 1}) Submit(n, rank, {Allreduce("a", {8})});
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(out->evicted_ids, ElementsAre(1u));
  EXPECT_THAT(Assignments(*out), ElementsAre(std::pair<std::string, uint32_t>("a", 2)));
  EXPECT_THAT(CacheIds(*out), ElementsAre(ElementsAre(2u)));
  EXPECT_THAT(out->responses[0].tensor_sizes, ElementsAre(8));

  // The old id is unknown now: only the rank that used it is asked to resend.
  Submit(n, 0, {}, {1});
  out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(out->notices[0].resend_ids, ElementsAre(1u));
  EXPECT_TRUE(out->notices[1].empty());
  EXPECT_THAT(out->responses, IsEmpty());
}

TEST_F(NegotiatorTest, OldIdAgainstChangedFullRequestIsAMismatch) {
  NegotiatorOptions o = Options(2);
  o.cache_capacity = 16;
  Negotiator n(o);
  for (int rank : {0, 1}) Submit(n, rank, {Allreduce("a", {4})});
  ASSERT_TRUE(Poll(n).has_value());

  Submit(n, 0, {Allreduce("a", {8})});
  Submit(n, 1, {}, {1});
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  ASSERT_THAT(out->responses, SizeIs(1));
  EXPECT_EQ(out->responses[0].type, Response::Type::kError);
  EXPECT_EQ(out->responses[0].error_message,
            "Mismatched allreduce tensor shapes for tensor 'a': rank 0 (node-a) sent [8] but "
            "rank 1 (node-b) sent [4].");
  EXPECT_THAT(out->responses[0].names, ElementsAre("a"));
  EXPECT_THAT(out->responses[0].cache_ids, ElementsAre(0u));
  EXPECT_THAT(out->cache_assignments, IsEmpty());
  EXPECT_THAT(out->evicted_ids, IsEmpty());
}

TEST_F(NegotiatorTest, LeastRecentlyUsedEntryIsEvictedAtCapacity) {
  std::unique_ptr<Negotiator> cached = TwoCachedOfTwo();
  Negotiator& n = *cached;
  for (int rank : {0, 1}) Submit(n, rank, {}, {1});  // a is now the most recently used
  ASSERT_TRUE(Poll(n).has_value());

  for (int rank : {0, 1}) Submit(n, rank, {Allreduce("c")});
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(out->evicted_ids, ElementsAre(2u));
  EXPECT_THAT(Assignments(*out), ElementsAre(std::pair<std::string, uint32_t>("c", 3)));

  Submit(n, 1, {}, {2, 1});
  out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_TRUE(out->notices[0].empty());
  EXPECT_THAT(out->notices[1].resend_ids, ElementsAre(2u));
  EXPECT_THAT(out->notices[1].errors, IsEmpty());
}

TEST_F(NegotiatorTest, AnEntryTheRanksUsedAmongThemselvesIsNotEvictedAsUnused) {
  // Local negotiation: the ranks used `a` without the coordinator and say so (Touch); `b`, not
  // used since, goes when `c` needs the room.
  std::unique_ptr<Negotiator> cached = TwoCachedOfTwo();
  Negotiator& n = *cached;
  n.Touch(std::vector<uint32_t>{1, 99});  // an unknown id is ignored
  for (int rank : {0, 1}) Submit(n, rank, {Allreduce("c")});
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(out->evicted_ids, ElementsAre(2u));

  // Not used since, `a` is now the least recently used: it goes next.
  for (int rank : {0, 1}) Submit(n, rank, {Allreduce("d")});
  out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(out->evicted_ids, ElementsAre(1u));
}

TEST_F(NegotiatorTest, IdEvictedInTheCycleThatAssignedItIsNotAnnounced) {
  NegotiatorOptions o = Options(2);
  o.cache_capacity = 1;
  o.fusion_threshold_bytes = 0;
  Negotiator n(o);
  for (int rank : {0, 1}) Submit(n, rank, {Allreduce("a"), Allreduce("b")});
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(Assignments(*out), ElementsAre(std::pair<std::string, uint32_t>("b", 2)));
  EXPECT_THAT(Names(*out), ElementsAre(ElementsAre("a"), ElementsAre("")));
  EXPECT_THAT(CacheIds(*out), ElementsAre(ElementsAre(0u), ElementsAre(2u)));
}

TEST_F(NegotiatorTest, UnknownCacheIdAsksOnlyThatRankToResend) {
  NegotiatorOptions o = Options(3);
  o.cache_capacity = 16;
  Negotiator n(o);
  Submit(n, 1, {}, {42});
  EXPECT_EQ(n.NextDeadline(), absl::InfinitePast());
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  ASSERT_THAT(out->notices, SizeIs(3));
  EXPECT_TRUE(out->notices[0].empty());
  EXPECT_THAT(out->notices[1].resend_ids, ElementsAre(42u));
  EXPECT_THAT(out->notices[1].errors, IsEmpty());
  EXPECT_TRUE(out->notices[2].empty());
  EXPECT_THAT(out->responses, IsEmpty());
  EXPECT_EQ(n.stats().requests, 1);
  EXPECT_EQ(Poll(n), std::nullopt);  // a notice is delivered once
}

// The steady state's shortcut (a tensor first requested by id is found by id) answers exactly as
// the full path: a second request by id on one rank, a joined rank's request by id, an id evicted
// or a cache turned off while its tensor waits.
TEST_F(NegotiatorTest, RequestsByIdOfAWaitingTensorMeetTheSameChecksAsByName) {
  NegotiatorOptions o = Options(3);
  o.cache_capacity = 2;
  o.fusion_threshold_bytes = 0;
  Negotiator n(o);
  for (int rank : {0, 1, 2}) Submit(n, rank, {Allreduce("a"), Allreduce("b")});
  ASSERT_TRUE(Poll(n).has_value());  // a: 1, b: 2

  // Twice by id on rank 0: an error for rank 0 alone; the tensor still completes.
  Submit(n, 0, {}, {1});
  Submit(n, 0, {}, {1});
  Submit(n, 1, {}, {1});
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  ASSERT_THAT(out->notices[0].errors, SizeIs(1));
  EXPECT_EQ(out->notices[0].errors[0].error_message,
            "Tensor 'a' is already in flight on rank 0 (node-a): wait for it to complete before "
            "submitting it again, or use a different name.");
  EXPECT_THAT(out->responses, IsEmpty());
  Submit(n, 2, {}, {1});
  out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(CacheIds(*out), ElementsAre(ElementsAre(1u)));
  EXPECT_TRUE(NoNotices(*out));

  // A joined rank's request by id is refused; the others' complete it without it.
  Submit(n, 0, {}, {2});
  Submit(n, 2, {JoinRequest()});
  Submit(n, 2, {}, {2});
  Submit(n, 1, {}, {2});
  out = Poll(n);
  ASSERT_TRUE(out.has_value());
  ASSERT_THAT(out->notices[2].errors, SizeIs(1));
  EXPECT_EQ(out->notices[2].errors[0].error_message,
            "Tensor 'b' was submitted by rank 2 (node-c) after it joined; a joined rank submits no "
            "collectives.");
  EXPECT_THAT(CacheIds(*out), ElementsAre(ElementsAre(2u)));
  for (int rank : {0, 1}) Submit(n, rank, {JoinRequest()});
  ASSERT_TRUE(Poll(n).has_value());

  // Id 1 evicted while 'a' waits for rank 1 (c and d fill the cache): rank 1's request by id 1 is
  // a resend, as for any unknown id, and 'a' completes once it comes in full.
  Submit(n, 0, {}, {1});
  for (int rank : {0, 1, 2}) Submit(n, rank, {Allreduce("c"), Allreduce("d")});
  clock_.Advance(absl::Milliseconds(10));  // c and d go without waiting for a
  out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(out->evicted_ids, ElementsAre(1u, 2u));
  Submit(n, 1, {}, {1});
  Submit(n, 2, {}, {1});
  out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(out->notices[1].resend_ids, ElementsAre(1u));
  EXPECT_THAT(out->notices[2].resend_ids, ElementsAre(1u));
  EXPECT_THAT(out->responses, IsEmpty());
  for (int rank : {1, 2}) Submit(n, rank, {Allreduce("a")});
  out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(Names(*out), ElementsAre(ElementsAre("")));
  EXPECT_THAT(Assignments(*out), ElementsAre(std::pair<std::string, uint32_t>("a", 5)));

  // The cache turned off while 'a' waits by id: the others' requests by that id are resends.
  Submit(n, 0, {}, {5});
  n.SetCacheEnabled(false);
  Submit(n, 1, {}, {5});
  out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(out->notices[1].resend_ids, ElementsAre(5u));
}

TEST_F(NegotiatorTest, CapacityZeroKeepsNamesAndAssignsNothing) {
  Negotiator n(Options(2));
  for (int rank : {0, 1}) Submit(n, rank, {Allreduce("a")});
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(out->cache_assignments, IsEmpty());
  EXPECT_THAT(Names(*out), ElementsAre(ElementsAre("a")));
  EXPECT_THAT(CacheIds(*out), ElementsAre(ElementsAre(0u)));
}

TEST_F(NegotiatorTest, AllgatherIsNotCached) {
  NegotiatorOptions o = Options(2);
  o.cache_capacity = 16;
  Negotiator n(o);
  Submit(n, 0, {Allgather("g", {1})});
  Submit(n, 1, {Allgather("g", {2})});
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(out->cache_assignments, IsEmpty());
  EXPECT_THAT(Names(*out), ElementsAre(ElementsAre("g")));
  EXPECT_THAT(out->responses[0].tensor_sizes, ElementsAre(1, 2));
}

// ---- Mismatches: every rank gets one error response naming both ranks and both values ----

struct MismatchCase {
  std::string label;
  TensorRequest first;   // sent by rank 2 first, and by rank 0
  TensorRequest second;  // sent by rank 1
  std::string message;
};

class MismatchTest : public NegotiatorTest, public ::testing::WithParamInterface<MismatchCase> {};

TEST_P(MismatchTest, EveryRankReceivesTheSameErrorNamingBothRanksAndValues) {
  Negotiator n(Options(3));
  Submit(n, 2, {GetParam().first});
  Submit(n, 0, {GetParam().first});
  Submit(n, 1, {GetParam().second});
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  ASSERT_THAT(out->responses, SizeIs(1));
  const Response& r = out->responses[0];
  EXPECT_EQ(r.type, Response::Type::kError);
  EXPECT_EQ(r.error_message, GetParam().message);
  EXPECT_THAT(r.names, ElementsAre("t"));
  EXPECT_THAT(r.cache_ids, ElementsAre(0u));
  EXPECT_THAT(r.tensor_sizes, IsEmpty());
  EXPECT_TRUE(NoNotices(*out));
  EXPECT_EQ(n.stats().tensors_negotiated, 1);
}

TensorRequest With(TensorRequest r, void (*change)(TensorRequest&)) {
  change(r);
  return r;
}

INSTANTIATE_TEST_SUITE_P(
    Negotiator, MismatchTest,
    ::testing::Values(
        MismatchCase{"Type", Allreduce("t"), Allgather("t", {4}),
                     "Mismatched collective operations for tensor 't': rank 2 (node-c) sent "
                     "allreduce but rank 1 (node-b) sent allgather."},
        MismatchCase{"TypeAllgatherFirst", Allgather("t", {4}), Allreduce("t"),
                     "Mismatched collective operations for tensor 't': rank 2 (node-c) sent "
                     "allgather but rank 1 (node-b) sent allreduce."},
        MismatchCase{"TypeBroadcast", Broadcast("t", 0), Allgather("t", {4}),
                     "Mismatched collective operations for tensor 't': rank 2 (node-c) sent "
                     "broadcast but rank 1 (node-b) sent allgather."},
        MismatchCase{"Dtype", Allreduce("t"), Allreduce("t", {4}, DataType::kFloat64),
                     "Mismatched allreduce data types for tensor 't': rank 2 (node-c) sent "
                     "float32 but rank 1 (node-b) sent float64."},
        MismatchCase{"BroadcastDtype", Broadcast("t", 0),
                     With(Broadcast("t", 0), [](TensorRequest& r) { r.dtype = DataType::kInt64; }),
                     "Mismatched broadcast data types for tensor 't': rank 2 (node-c) sent "
                     "float32 but rank 1 (node-b) sent int64."},
        MismatchCase{"Shape", Allreduce("t", {2, 3}), Allreduce("t", {3, 2}),
                     "Mismatched allreduce tensor shapes for tensor 't': rank 2 (node-c) sent "
                     "[2, 3] but rank 1 (node-b) sent [3, 2]."},
        MismatchCase{"ShapeRank", Allreduce("t", {6}), Allreduce("t", {2, 3}),
                     "Mismatched allreduce tensor shapes for tensor 't': rank 2 (node-c) sent "
                     "[6] but rank 1 (node-b) sent [2, 3]."},
        MismatchCase{"AllgatherLaterDims", Allgather("t", {2, 3}), Allgather("t", {5, 4}),
                     "Mismatched allgather tensor shapes (all dimensions but the first must "
                     "match) for tensor 't': rank 2 (node-c) sent [2, 3] but rank 1 (node-b) "
                     "sent [5, 4]."},
        MismatchCase{"AllgatherDimCount", Allgather("t", {2, 3}), Allgather("t", {2, 3, 1}),
                     "Mismatched allgather tensor shapes (all dimensions but the first must "
                     "match) for tensor 't': rank 2 (node-c) sent [2, 3] but rank 1 (node-b) "
                     "sent [2, 3, 1]."},
        MismatchCase{"BroadcastRoot", Broadcast("t", 0), Broadcast("t", 2),
                     "Mismatched broadcast root ranks for tensor 't': rank 2 (node-c) sent root "
                     "0 but rank 1 (node-b) sent root 2."},
        MismatchCase{
            "ReduceOp",
            With(Allreduce("t"), [](TensorRequest& r) { r.reduce_op = ReduceOp::kSum; }),
            With(Allreduce("t"), [](TensorRequest& r) { r.reduce_op = ReduceOp::kUnspecified; }),
            "Mismatched allreduce reduction ops for tensor 't': rank 2 (node-c) sent sum "
            "but rank 1 (node-b) sent average."},
        MismatchCase{"ReduceOpMinMax",
                     With(Allreduce("t"), [](TensorRequest& r) { r.reduce_op = ReduceOp::kMax; }),
                     With(Allreduce("t"), [](TensorRequest& r) { r.reduce_op = ReduceOp::kMin; }),
                     "Mismatched allreduce reduction ops for tensor 't': rank 2 (node-c) sent max "
                     "but rank 1 (node-b) sent min."},
        MismatchCase{"Prescale",
                     With(Allreduce("t"), [](TensorRequest& r) { r.prescale_factor = 0.5; }),
                     With(Allreduce("t"), [](TensorRequest& r) { r.prescale_factor = 0.25; }),
                     "Mismatched allreduce prescale factors for tensor 't': rank 2 (node-c) sent "
                     "0.5 but rank 1 (node-b) sent 0.25."},
        MismatchCase{"Postscale", Allreduce("t"),
                     With(Allreduce("t"), [](TensorRequest& r) { r.postscale_factor = 2; }),
                     "Mismatched allreduce postscale factors for tensor 't': rank 2 (node-c) sent "
                     "1 but rank 1 (node-b) sent 2."},
        MismatchCase{"Device", Allreduce("t"),
                     With(Allreduce("t"), [](TensorRequest& r) { r.device = 3; }),
                     "Mismatched allreduce devices for tensor 't': rank 2 (node-c) sent cpu but "
                     "rank 1 (node-b) sent cuda:3."},
        MismatchCase{"Group", Allreduce("t"), Grouped(Allreduce("t"), 3, 2),
                     "Mismatched allreduce groups for tensor 't': rank 2 (node-c) sent group 0 "
                     "of 0 but rank 1 (node-b) sent group 3 of 2."}),
    [](const ::testing::TestParamInfo<MismatchCase>& info) { return info.param.label; });

TEST_F(NegotiatorTest, DifferentGpuOrdinalsOnDifferentRanksAgree) {
  Negotiator n(Options(2));
  Submit(n, 0, {With(Allreduce("t"), [](TensorRequest& r) { r.device = 0; })});
  Submit(n, 1, {With(Allreduce("t"), [](TensorRequest& r) { r.device = 1; })});
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  ASSERT_THAT(out->responses, SizeIs(1));
  EXPECT_EQ(out->responses[0].type, Response::Type::kAllreduce);
  EXPECT_EQ(out->responses[0].error_message, "");
}

TEST_F(NegotiatorTest, ZeroScaleFactorsMeanOne) {
  Negotiator n(Options(2));
  Submit(n, 0, {With(Allreduce("t"), [](TensorRequest& r) {
           r.prescale_factor = 0;
           r.postscale_factor = 0;
         })});
  Submit(n, 1, {Allreduce("t")});
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  ASSERT_THAT(out->responses, SizeIs(1));
  EXPECT_EQ(out->responses[0].type, Response::Type::kAllreduce);
  EXPECT_EQ(out->responses[0].prescale_factor, 1.0);
  EXPECT_EQ(out->responses[0].postscale_factor, 1.0);
}

TEST_F(NegotiatorTest, MismatchedTensorDoesNotFuseWithHealthyOnes) {
  Negotiator n(Options(2));
  Submit(n, 0, {Allreduce("bad", {2}), Allreduce("good")});
  Submit(n, 1, {Allreduce("bad", {3}), Allreduce("good")});
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(Names(*out), ElementsAre(ElementsAre("bad"), ElementsAre("good")));
  EXPECT_EQ(out->responses[0].type, Response::Type::kError);
  EXPECT_EQ(out->responses[1].type, Response::Type::kAllreduce);
}

// ---- Rank-only errors ----

TEST_F(NegotiatorTest, ARankCannotGrowThePendingTableBeyondItsBound) {
  Negotiator n(Options(2));
  std::vector<TensorRequest> batch;
  for (size_t i = 0; i < Negotiator::kMaxPending; ++i)
    batch.push_back(Allreduce(absl::StrCat("t", i)));
  Submit(n, 0, std::move(batch));
  EXPECT_FALSE(Poll(n).has_value());  // all waiting for rank 1
  Submit(n, 0, {Allreduce("one-more")});
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  ASSERT_THAT(out->notices[0].errors, SizeIs(1));
  EXPECT_EQ(out->notices[0].errors[0].error_message,
            "Tensor 'one-more' was not accepted: 65536 tensors are in negotiation in this job, the "
            "most one job may (did the other ranks submit the tensors rank 0 (node-a) "
            "submitted?)");
  // Rank 1 completing one makes room again; its own names already pending are always taken.
  Submit(n, 1, {Allreduce("t0")});
  clock_.Advance(absl::Seconds(1));  // past the cycle time: others are still partly submitted
  out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(Names(*out), ElementsAre(ElementsAre("t0")));
  Submit(n, 0, {Allreduce("one-more")});
  EXPECT_FALSE(Poll(n).has_value());  // accepted: pending, waiting for rank 1
}

TEST_F(NegotiatorTest, DuplicateInFlightNameIsAnErrorForThatRankOnly) {
  Negotiator n(Options(2));
  Submit(n, 0, {Allreduce("a")});
  Submit(n, 0, {Allreduce("a")});
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(out->responses, IsEmpty());
  EXPECT_TRUE(out->notices[1].empty());
  ASSERT_THAT(out->notices[0].errors, SizeIs(1));
  const Response& e = out->notices[0].errors[0];
  EXPECT_EQ(e.type, Response::Type::kError);
  EXPECT_THAT(e.names, ElementsAre("a"));
  EXPECT_EQ(e.error_message,
            "Tensor 'a' is already in flight on rank 0 (node-a): wait for it to complete before "
            "submitting it again, or use a different name.");

  // The first submission is untouched and completes normally; then the name is free again.
  Submit(n, 1, {Allreduce("a")});
  out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(Names(*out), ElementsAre(ElementsAre("a")));
  EXPECT_TRUE(NoNotices(*out));
  for (int rank : {0, 1}) Submit(n, rank, {Allreduce("a")});
  out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(Names(*out), ElementsAre(ElementsAre("a")));
  EXPECT_TRUE(NoNotices(*out));
}

struct InvalidCase {
  std::string label;
  TensorRequest request;
  std::string message;
};

class InvalidRequestTest : public NegotiatorTest,
                           public ::testing::WithParamInterface<InvalidCase> {};

TEST_P(InvalidRequestTest, IsAnErrorForThatRankOnlyAndDisturbsNothingElse) {
  Negotiator n(Options(3));
  Submit(n, 0, {Allreduce("ok")});
  Submit(n, 2, {Allreduce("ok")});
  Submit(n, 1, {GetParam().request, Allreduce("ok")});
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(Names(*out), ElementsAre(ElementsAre("ok")));
  EXPECT_TRUE(out->notices[0].empty());
  EXPECT_TRUE(out->notices[2].empty());
  EXPECT_THAT(out->notices[1].resend_ids, IsEmpty());
  ASSERT_THAT(out->notices[1].errors, SizeIs(1));
  const Response& e = out->notices[1].errors[0];
  EXPECT_EQ(e.type, Response::Type::kError);
  EXPECT_THAT(e.names, ElementsAre(GetParam().request.name));
  EXPECT_EQ(e.error_message, GetParam().message);
  EXPECT_EQ(Poll(n), std::nullopt);  // nothing of the bad request was kept
}

INSTANTIATE_TEST_SUITE_P(
    Negotiator, InvalidRequestTest,
    ::testing::Values(
        InvalidCase{"EmptyName", Allreduce(""),
                    "Invalid allreduce request for tensor '' from rank 1 (node-b): name is "
                    "empty."},
        InvalidCase{"NegativeDim", Allreduce("t", {2, -1}),
                    "Invalid allreduce request for tensor 't' from rank 1 (node-b): shape[1] = -1 "
                    "is out of bounds [0, 2^40]."},
        InvalidCase{"TooManyElements", Allreduce("t", {int64_t{1} << 20, int64_t{1} << 21}),
                    "Invalid allreduce request for tensor 't' from rank 1 (node-b): shape has "
                    "more than 2^40 elements."},
        InvalidCase{"TooManyDims", Allreduce("t", std::vector<int64_t>(17, 1)),
                    "Invalid allreduce request for tensor 't' from rank 1 (node-b): shape has 17 "
                    "dimensions; at most 16 are allowed."},
        InvalidCase{"RootTooLarge", Broadcast("t", 3),
                    "Invalid broadcast request for tensor 't' from rank 1 (node-b): root_rank 3 "
                    "is out of bounds [0, 2]."},
        InvalidCase{"RootNegative", Broadcast("t", -1),
                    "Invalid broadcast request for tensor 't' from rank 1 (node-b): root_rank -1 "
                    "is out of bounds [0, 2]."},
        InvalidCase{
            "NoType",
            With(Allreduce("t"), [](TensorRequest& r) { r.type = RequestType::kUnspecified; }),
            "Invalid unspecified request for tensor 't' from rank 1 (node-b): type 0 is "
            "not a collective."},
        InvalidCase{"NoDtype", Allreduce("t", {4}, DataType::kUnspecified),
                    "Invalid allreduce request for tensor 't' from rank 1 (node-b): dtype 0 is "
                    "not a data type."},
        InvalidCase{"ScalarAllgather", Allgather("t", {}),
                    "Invalid allgather request for tensor 't' from rank 1 (node-b): allgather "
                    "needs a tensor of at least one dimension."},
        InvalidCase{"Device", With(Allreduce("t"), [](TensorRequest& r) { r.device = 1024; }),
                    "Invalid allreduce request for tensor 't' from rank 1 (node-b): device 1024 "
                    "is out of bounds [-1, 1023]."},
        InvalidCase{"Prescale",
                    With(Allreduce("t"),
                         [](TensorRequest& r) {
                           r.prescale_factor = std::numeric_limits<double>::infinity();
                         }),
                    "Invalid allreduce request for tensor 't' from rank 1 (node-b): "
                    "prescale_factor is not finite."},
        InvalidCase{"GroupSize", Grouped(Allreduce("t"), 1, 0),
                    "Invalid allreduce request for tensor 't' from rank 1 (node-b): group_size 0 "
                    "is out of bounds [1, 65536]."}),
    [](const ::testing::TestParamInfo<InvalidCase>& info) { return info.param.label; });

TEST_F(NegotiatorTest, OverLongNameIsRejectedWithItsPrefixAndLength) {
  Negotiator n(Options(2));
  const std::string name = std::string(96, 'x') + std::string(1 << 20, 'y');  // 1 MiB + 96 bytes
  Submit(n, 0, {Allreduce(name)});
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  ASSERT_THAT(out->notices[0].errors, SizeIs(1));
  // The message quotes a readable prefix, not the megabyte; the error still names the tensor whole
  // so the worker finds the operation it fails.
  EXPECT_EQ(out->notices[0].errors[0].error_message,
            absl::StrCat("Invalid allreduce request for tensor '", std::string(96, 'x'),
                         "... (1048672 bytes)' from rank 0 (node-a): name is 1048672 bytes long; "
                         "at most 1024 are allowed."));
  EXPECT_THAT(out->notices[0].errors[0].names, ElementsAre(name));
}

// ---- Join ----

TEST_F(NegotiatorTest, TensorWaitsOnlyForRanksThatHaveNotJoined) {
  Negotiator n(Options(3));
  Submit(n, 2, {JoinRequest()});
  Submit(n, 0, {Allreduce("a")});
  EXPECT_EQ(Poll(n), std::nullopt);  // rank 1 has neither submitted nor joined
  Submit(n, 1, {Allreduce("a")});
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  ASSERT_THAT(out->responses, SizeIs(1));
  EXPECT_EQ(out->responses[0].type, Response::Type::kAllreduce);
  EXPECT_THAT(out->responses[0].names, ElementsAre("a"));
  // The joined rank contributes zeros of the full size.
  EXPECT_THAT(out->responses[0].tensor_sizes, ElementsAre(4));
}

TEST_F(NegotiatorTest, JoinCompletesTensorsThatWaitedOnlyForTheJoiningRank) {
  Negotiator n(Options(3));
  Submit(n, 0, {Allreduce("a")});
  Submit(n, 1, {Allreduce("a")});
  EXPECT_EQ(Poll(n), std::nullopt);
  Submit(n, 2, {JoinRequest()});
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  ASSERT_THAT(out->responses, SizeIs(1));
  EXPECT_EQ(out->responses[0].type, Response::Type::kAllreduce);
  EXPECT_THAT(out->responses[0].tensor_sizes, ElementsAre(4));
}

// As Horovod: with a rank joined, allgather and broadcast fail on every rank, whether the join
// came first or last.
TEST_F(NegotiatorTest, AllgatherWhileARankHasJoinedFailsAsInHorovod) {
  Negotiator n(Options(3));
  Submit(n, 0, {Allgather("g", {2, 3})});
  Submit(n, 1, {Allgather("g", {3, 3})});
  Submit(n, 2, {JoinRequest()});
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  ASSERT_THAT(out->responses, SizeIs(1));
  EXPECT_EQ(out->responses[0].type, Response::Type::kError);
  EXPECT_THAT(out->responses[0].names, ElementsAre("g"));
  EXPECT_EQ(out->responses[0].error_message,
            "Allgather is not supported with Join at this time. Specify sparse_to_dense=True if "
            "using DistributedOptimizer (tensor 'g'; rank 2 (node-c) has joined)");

  // The next collective works: an allreduce with the rank still joined.
  Submit(n, 0, {Allreduce("after")});
  Submit(n, 1, {Allreduce("after")});
  out = Poll(n);
  ASSERT_TRUE(out.has_value());
  ASSERT_THAT(out->responses, SizeIs(1));
  EXPECT_EQ(out->responses[0].type, Response::Type::kAllreduce);
}

TEST_F(NegotiatorTest, AllRanksJoinedGivesJoinResponseWithTheLastJoinedRank) {
  Negotiator n(Options(3));
  Submit(n, 2, {JoinRequest()});
  Submit(n, 0, {JoinRequest()});
  EXPECT_EQ(Poll(n), std::nullopt);
  Submit(n, 1, {JoinRequest()});
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  ASSERT_THAT(out->responses, SizeIs(1));
  EXPECT_EQ(out->responses[0].type, Response::Type::kJoin);
  EXPECT_EQ(out->responses[0].last_joined_rank, 1);
  EXPECT_THAT(out->responses[0].names, IsEmpty());

  // The join round is over: a new tensor needs every rank again.
  Submit(n, 0, {Allreduce("a")});
  Submit(n, 1, {Allreduce("a")});
  EXPECT_EQ(Poll(n), std::nullopt);
  Submit(n, 2, {Allreduce("a")});
  out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(Names(*out), ElementsAre(ElementsAre("a")));
}

TEST_F(NegotiatorTest, JoinedRankSubmittingATensorGetsAnError) {
  Negotiator n(Options(2));
  Submit(n, 1, {JoinRequest()});
  Submit(n, 1, {Allreduce("a")});
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_TRUE(out->notices[0].empty());
  ASSERT_THAT(out->notices[1].errors, SizeIs(1));
  EXPECT_EQ(out->notices[1].errors[0].error_message,
            "Tensor 'a' was submitted by rank 1 (node-b) after it joined; a joined rank submits "
            "no collectives.");
}

TEST_F(NegotiatorTest, BroadcastWhileARankHasJoinedFailsAsInHorovod) {
  for (int root : {0, 2}) {  // a root that has not joined, and one that has
    Negotiator n(Options(3));
    Submit(n, 2, {JoinRequest()});
    Submit(n, 0, {Broadcast("b", root)});
    Submit(n, 1, {Broadcast("b", root)});
    std::optional<CycleOutput> out = Poll(n);
    ASSERT_TRUE(out.has_value());
    ASSERT_THAT(out->responses, SizeIs(1));
    EXPECT_EQ(out->responses[0].type, Response::Type::kError);
    EXPECT_EQ(out->responses[0].error_message,
              "Broadcast is not supported with Join at this time. (tensor 'b'; rank 2 (node-c) "
              "has joined)");
  }
}

// ---- A rank that ended ----

TEST_F(NegotiatorTest, RankEndedFailsWhatOthersWaitInAndEveryLaterCollectiveThatNeedsIt) {
  Negotiator n(Options(3));
  Submit(n, 0, {Allreduce("a"), Broadcast("b", 0)});
  Submit(n, 1, {Allreduce("a")});
  EXPECT_EQ(Poll(n), std::nullopt);
  n.RankEnded(2, "rank 2 on host node-c exited with status 0", clock_.Now());
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  ASSERT_THAT(out->responses, SizeIs(2));
  EXPECT_EQ(out->responses[0].type, Response::Type::kError);
  EXPECT_THAT(Names(*out), ElementsAre(ElementsAre("a"), ElementsAre("b")));
  EXPECT_EQ(out->responses[0].error_message,
            "Allreduce of tensor 'a' can never complete: rank 2 on host node-c exited with status "
            "0 before submitting it (one of the ranks finished execution).");
  EXPECT_EQ(out->responses[1].error_message,
            "Broadcast of tensor 'b' can never complete: rank 2 on host node-c exited with status "
            "0 before submitting it (one of the ranks finished execution).");
  // What the job fails with, once.
  EXPECT_EQ(n.TakeEndedRankFailure(), out->responses[0].error_message);
  EXPECT_EQ(n.TakeEndedRankFailure(), "");

  // A collective submitted later fails at once for the rank that submits it: rank 1's b (its
  // worker had no b when the list came, so the list's error reached no operation of it), and a
  // new c on rank 0.
  Submit(n, 1, {Broadcast("b", 0)});
  Submit(n, 0, {Allreduce("c")});
  out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(out->responses, IsEmpty());
  ASSERT_THAT(out->notices[1].errors, SizeIs(1));
  EXPECT_EQ(out->notices[1].errors[0].error_message,
            "Broadcast of tensor 'b' can never complete: rank 2 on host node-c exited with status "
            "0 before submitting it (one of the ranks finished execution).");
  ASSERT_THAT(out->notices[0].errors, SizeIs(1));
  EXPECT_THAT(out->notices[0].errors[0].names, ElementsAre("c"));
  EXPECT_EQ(out->notices[0].errors[0].error_message,
            "Allreduce of tensor 'c' can never complete: rank 2 on host node-c exited with status "
            "0 before submitting it (one of the ranks finished execution).");
  EXPECT_EQ(n.TakeEndedRankFailure(), out->notices[1].errors[0].error_message);
}

TEST_F(NegotiatorTest, RankThatEndsWithNothingPendingHarmsNoOneAndSetsWithoutItGoOn) {
  Negotiator n(Options(3));
  n.RankEnded(2, "rank 2 on host node-c exited with status 0", clock_.Now());
  EXPECT_EQ(Poll(n), std::nullopt);
  EXPECT_EQ(n.TakeEndedRankFailure(), "");
  // A process set of ranks 0 and 1 does not need it.
  TensorRequest in_set = Allreduce("s");
  in_set.process_set_id = 1;
  in_set.process_set_ranks = {0, 1};
  Submit(n, 0, {in_set});
  Submit(n, 1, {in_set});
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  ASSERT_THAT(out->responses, SizeIs(1));
  EXPECT_EQ(out->responses[0].type, Response::Type::kAllreduce);
  EXPECT_EQ(n.TakeEndedRankFailure(), "");
}

TEST_F(NegotiatorTest, TheClientsOwnBackgroundCollectiveFailsWithoutFailingTheJob) {
  Negotiator n(Options(2));
  // init()'s allgather of local sizes: no rank waits for it unless it asks is_homogeneous().
  Submit(n, 0, {Allgather("ringmaster.init.local_sizes", {1})});
  n.RankEnded(1, "rank 1 on host node-b exited with status 0", clock_.Now());
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  ASSERT_THAT(out->responses, SizeIs(1));
  EXPECT_EQ(out->responses[0].type, Response::Type::kError);
  EXPECT_EQ(n.TakeEndedRankFailure(), "");
}

TEST_F(NegotiatorTest, RankEndedWithATensorInFlightSaysSo) {
  Negotiator n(Options(2));
  Submit(n, 1, {Allreduce("a")});
  n.RankEnded(1, "rank 1 on host node-b exited with status 1", clock_.Now());
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  ASSERT_THAT(out->responses, SizeIs(1));
  EXPECT_EQ(out->responses[0].error_message,
            "Allreduce of tensor 'a' can never complete: rank 1 on host node-b exited with status "
            "1 with it in flight (one of the ranks finished execution).");
  // Nobody else waited in it: nothing to fail the job with yet.
  EXPECT_EQ(n.TakeEndedRankFailure(), "");
  // Rank 0 submits it later: the tensor is new again, and cannot complete.
  Submit(n, 0, {Allreduce("a")});
  out = Poll(n);
  ASSERT_TRUE(out.has_value());
  ASSERT_THAT(out->notices[0].errors, SizeIs(1));
  EXPECT_EQ(out->notices[0].errors[0].error_message,
            "Allreduce of tensor 'a' can never complete: rank 1 on host node-b exited with status "
            "1 before submitting it (one of the ranks finished execution).");
}

TEST_F(NegotiatorTest, JoinNeverCompletesOnceARankEnded) {
  Negotiator n(Options(3));
  TensorRequest join0 = JoinRequest();
  join0.name = "join.1";
  Submit(n, 0, {join0});  // rank 0 waits in its join
  n.RankEnded(2, "rank 2 on host node-c exited with status 0", clock_.Now());
  Submit(n, 1, {JoinRequest()});  // rank 1 joins after the end
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(out->responses, IsEmpty());
  const std::string want =
      "Join can never complete: rank 2 on host node-c exited with status 0 without joining (one "
      "of the ranks finished execution).";
  for (int rank : {0, 1}) {
    ASSERT_THAT(out->notices[rank].errors, SizeIs(1)) << rank;
    EXPECT_EQ(out->notices[rank].errors[0].error_message, want);
  }
  EXPECT_THAT(out->notices[0].errors[0].names, ElementsAre("join.1"));
  EXPECT_THAT(out->notices[1].errors[0].names, ElementsAre("join"));
  EXPECT_EQ(n.TakeEndedRankFailure(), want);
  // Rank 0 is no longer joined: an allreduce of ranks 0 and 1 in a set goes through.
  TensorRequest in_set = Allreduce("s");
  in_set.process_set_id = 1;
  in_set.process_set_ranks = {0, 1};
  Submit(n, 0, {in_set});
  Submit(n, 1, {in_set});
  out = Poll(n);
  ASSERT_TRUE(out.has_value());
  ASSERT_THAT(out->responses, SizeIs(1));
  EXPECT_EQ(out->responses[0].type, Response::Type::kAllreduce);
}

// ---- Stalls ----

TEST_F(NegotiatorTest, StallReportNamesMissingRanksOncePerPeriodThenShutsDown) {
  NegotiatorOptions o = Options(3);
  o.stall_check = absl::Seconds(10);
  o.stall_shutdown = absl::Seconds(30);
  Negotiator n(o);
  const absl::Time t0 = clock_.Now();
  Submit(n, 0, {Allreduce("b"), Allreduce("a")});
  Submit(n, 1, {Allreduce("a")});

  StallReport report = n.CheckStalls(t0 + absl::Seconds(10) - absl::Nanoseconds(1));
  EXPECT_EQ(report.message, "");
  EXPECT_FALSE(report.shutdown);

  report = n.CheckStalls(t0 + absl::Seconds(10));
  EXPECT_EQ(report.message,
            "Stalled collectives in job job-000001: tensors submitted by some ranks have waited "
            "10s for the others (rank 1 (node-b) has not submitted 'b'; rank 2 (node-c) has not "
            "submitted 'a', 'b').");
  EXPECT_FALSE(report.shutdown);

  // Once per stall-check period.
  report = n.CheckStalls(t0 + absl::Seconds(19));
  EXPECT_EQ(report.message, "");
  EXPECT_FALSE(report.shutdown);

  report = n.CheckStalls(t0 + absl::Seconds(20));
  EXPECT_EQ(report.message,
            "Stalled collectives in job job-000001: tensors submitted by some ranks have waited "
            "20s for the others (rank 1 (node-b) has not submitted 'b'; rank 2 (node-c) has not "
            "submitted 'a', 'b').");
  EXPECT_FALSE(report.shutdown);

  report = n.CheckStalls(t0 + absl::Seconds(29));
  EXPECT_EQ(report.message, "");
  EXPECT_FALSE(report.shutdown);

  report = n.CheckStalls(t0 + absl::Seconds(30));
  EXPECT_EQ(report.message,
            "Stalled collectives in job job-000001: tensors submitted by some ranks have waited "
            "30s for the others (rank 1 (node-b) has not submitted 'b'; rank 2 (node-c) has not "
            "submitted 'a', 'b'). Stall shutdown time exceeded: failing the job.");
  EXPECT_TRUE(report.shutdown);

  // Past the shutdown time the report keeps coming, even within a period.
  report = n.CheckStalls(t0 + absl::Seconds(31));
  EXPECT_TRUE(report.shutdown);
  EXPECT_EQ(report.message,
            "Stalled collectives in job job-000001: tensors submitted by some ranks have waited "
            "31s for the others (rank 1 (node-b) has not submitted 'b'; rank 2 (node-c) has not "
            "submitted 'a', 'b'). Stall shutdown time exceeded: failing the job.");
}

TEST_F(NegotiatorTest, StallReportWithoutShutdownNeverShutsDown) {
  NegotiatorOptions o = Options(2);
  o.stall_check = absl::Seconds(10);
  Negotiator n(o);
  Submit(n, 0, {Allreduce("a")});
  clock_.Advance(absl::Hours(24));
  StallReport report = n.CheckStalls(clock_.Now());
  EXPECT_EQ(report.message,
            "Stalled collectives in job job-000001: tensors submitted by some ranks have waited "
            "24h for the others (rank 1 (node-b) has not submitted 'a').");
  EXPECT_FALSE(report.shutdown);
}

TEST_F(NegotiatorTest, StallReportListsAtMostTenNamesPerRank) {
  NegotiatorOptions o = Options(2);
  o.stall_check = absl::Seconds(1);
  Negotiator n(o);
  std::vector<TensorRequest> requests;
  for (int i = 11; i >= 0; --i)
    requests.push_back(Allreduce(absl::StrCat("t", i < 10 ? "0" : "", i)));
  Submit(n, 0, requests);
  StallReport report = n.CheckStalls(clock_.Now() + absl::Seconds(1));
  EXPECT_EQ(report.message,
            "Stalled collectives in job job-000001: tensors submitted by some ranks have waited "
            "1s for the others (rank 1 (node-b) has not submitted 't00', 't01', 't02', 't03', "
            "'t04', 't05', 't06', 't07', 't08', 't09' and 2 more).");
}

TEST_F(NegotiatorTest, StallCheckIgnoresJoinedRanksAndCanBeDisabled) {
  NegotiatorOptions o = Options(3);
  o.stall_check = absl::Seconds(10);
  Negotiator n(o);
  Submit(n, 2, {JoinRequest()});
  Submit(n, 0, {Allreduce("a")});
  StallReport report = n.CheckStalls(clock_.Now() + absl::Seconds(10));
  EXPECT_EQ(report.message,
            "Stalled collectives in job job-000001: tensors submitted by some ranks have waited "
            "10s for the others (rank 1 (node-b) has not submitted 'a').");

  o.stall_check = absl::ZeroDuration();
  o.stall_shutdown = absl::Seconds(1);
  Negotiator disabled(o);
  Submit(disabled, 0, {Allreduce("a")});
  report = disabled.CheckStalls(clock_.Now() + absl::Hours(1));
  EXPECT_EQ(report.message, "");
  EXPECT_FALSE(report.shutdown);
}

TEST_F(NegotiatorTest, StatsCountRequestsCyclesAndTensors) {
  Negotiator n(Options(2));
  for (int rank : {0, 1}) Submit(n, rank, {Allreduce("a"), Allreduce("b")});
  ASSERT_TRUE(Poll(n).has_value());
  Submit(n, 0, {Allreduce("")});  // invalid: counted as a request, negotiated nowhere
  ASSERT_TRUE(Poll(n).has_value());
  NegotiatorStats s = n.stats();
  EXPECT_EQ(s.requests, 5);
  EXPECT_EQ(s.cycles, 2);
  EXPECT_EQ(s.tensors_negotiated, 2);
  // With the cache disabled every tensor requested in full still counts as a miss.
  EXPECT_EQ(s.cache_hits, 0);
  EXPECT_EQ(s.cache_misses, 2);
}

TEST_F(NegotiatorTest, TimelineEventsAreRecordedInOrderWithTimesThatNeverGoBack) {
  NegotiatorOptions o = Options(2);
  o.record_timeline = true;
  Negotiator n(o);
  const absl::Time t0 = clock_.Now();
  // Rank 1's batch takes the lock first although rank 0's was stamped earlier (a race between the
  // session threads): the events keep their order and the later one takes the earlier's time.
  n.Submit(1, {Allreduce("w")}, {}, t0 + absl::Microseconds(200));
  n.Submit(0, {Allreduce("w")}, {}, t0 + absl::Microseconds(100));
  std::vector<std::string> events;
  for (const NegotiationEvent& e : n.DrainTimeline()) {
    events.push_back(absl::StrCat(static_cast<int>(e.kind), ":", e.name, ":", e.rank, "@",
                                  absl::ToInt64Microseconds(e.time - t0)));
  }
  // kStart = 0, kRankReady = 1, kEnd = 2.
  EXPECT_THAT(events, ElementsAre("0:w:1@200", "1:w:1@200", "1:w:0@200", "2:w:-1@200"));
  EXPECT_THAT(n.DrainTimeline(), IsEmpty());
}

}  // namespace
}  // namespace ringmaster

// ---- Process sets ----

namespace ringmaster {
namespace {

TensorRequest InSet(TensorRequest r, int32_t id, std::vector<int32_t> ranks) {
  r.process_set_id = id;
  r.process_set_ranks = std::move(ranks);
  return r;
}

TEST_F(NegotiatorTest, AProcessSetsTensorIsReadyWhenItsMembersSubmittedAndSetsNameTheirOwn) {
  Negotiator n(Options(4));
  // The same name in two sets at once: two tensors, each ready with its own members.
  Submit(n, 0, {InSet(Allreduce("g"), 1, {0, 2})});
  Submit(n, 1, {InSet(Allreduce("g"), 2, {1, 3})});
  EXPECT_EQ(Poll(n), std::nullopt);
  Submit(n, 2, {InSet(Allreduce("g"), 1, {0, 2})});
  clock_.Advance(absl::Milliseconds(1));  // the cycle: set 2's "g" is still partial
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  ASSERT_THAT(out->responses, SizeIs(1));
  EXPECT_THAT(out->responses[0].names, ElementsAre("g"));
  EXPECT_EQ(out->responses[0].process_set_id, 1);
  EXPECT_THAT(out->responses[0].process_set_ranks, ElementsAre(0, 2));
  Submit(n, 3, {InSet(Allgather("g", {2 + 3, 2}), 2, {1, 3}), InSet(Allreduce("h"), 2, {1, 3})});
  Submit(n, 1, {InSet(Allreduce("h"), 2, {1, 3})});
  out = Poll(n);
  ASSERT_TRUE(out.has_value());
  // Set 2's "g" met an allgather from rank 3: a mismatch naming both; "h" is fine and is not
  // fused with another set's tensors.
  ASSERT_THAT(out->responses, SizeIs(2));
  EXPECT_EQ(out->responses[0].type, Response::Type::kError);
  EXPECT_EQ(out->responses[0].error_message,
            "Mismatched collective operations for tensor 'g': rank 1 (node-b) sent allreduce but "
            "rank 3 (node-d) sent allgather.");
  EXPECT_THAT(out->responses[1].names, ElementsAre("h"));
  EXPECT_THAT(out->responses[1].cache_ids, ElementsAre(0u));  // sets' tensors are not cached
}

TEST_F(NegotiatorTest, ProcessSetRequestsAreCheckedAndAMismatchedSetNamesBoth) {
  Negotiator n(Options(3));
  Submit(n, 1,
         {InSet(Allreduce("outside"), 1, {0, 2}), InSet(Allreduce("bad"), 1, {2, 0}),
          InSet(Broadcast("root", 0), 1, {1, 2})});
  std::optional<CycleOutput> out = Poll(n);
  ASSERT_TRUE(out.has_value());
  std::vector<std::string> errors;
  for (const Response& e : out->notices[1].errors) errors.push_back(e.error_message);
  EXPECT_THAT(errors,
              ElementsAre("Invalid allreduce request for tensor 'outside' from rank 1 (node-b): "
                          "the rank is not in process set 1 (ranks 0, 2).",
                          "Invalid allreduce request for tensor 'bad' from rank 1 (node-b): "
                          "process set 1 ranks 2, 0 are not distinct increasing ranks in [0, 2].",
                          "Invalid broadcast request for tensor 'root' from rank 1 (node-b): "
                          "root_rank 0 is not in process set 1 (ranks 1, 2)."));
  Submit(n, 0, {InSet(Allreduce("x"), 1, {0, 1})});
  Submit(n, 1, {InSet(Allreduce("x"), 1, {0, 1, 2})});
  Submit(n, 2, {InSet(Allreduce("x"), 1, {0, 1, 2})});
  out = Poll(n);
  ASSERT_TRUE(out.has_value());
  ASSERT_THAT(out->responses, SizeIs(1));
  EXPECT_EQ(out->responses[0].error_message,
            "Mismatched allreduce process sets for tensor 'x': rank 0 (node-a) sent process set 1 "
            "[0, 1] but rank 1 (node-b) sent process set 1 [0, 1, 2].");
}

}  // namespace
}  // namespace ringmaster

namespace ringmaster {
namespace {

// Who is slow, as the negotiator measures it: rank 2 asks for each step's tensors 50 ms after the
// others; the step is 100 ms. Every fourth tensor of a step is timed (the first included).
TEST(NegotiatorStragglersTest, ARankLateToEveryStepIsNamedWithItsLatenessBehindTheOthers) {
  NegotiatorOptions o;
  o.job_id = "job-000001";
  o.rank_hosts = {"node-a", "node-b", "node-c"};
  o.cache_capacity = 0;
  Negotiator n(o);
  absl::Time step_start = absl::UnixEpoch();
  for (int step = 0; step < 5; ++step) {
    for (int t = 0; t < 5; ++t) {
      const std::string name = absl::StrCat("grad.", t);
      const absl::Time at = step_start + absl::Milliseconds(t);
      n.Submit(0, {Allreduce(name)}, {}, at);
      n.Submit(1, {Allreduce(name)}, {}, at + absl::Milliseconds(2));
      n.Submit(2, {Allreduce(name)}, {}, at + absl::Milliseconds(50));
    }
    ASSERT_TRUE(n.Poll(step_start + absl::Milliseconds(60)).has_value());
    step_start += absl::Milliseconds(100);
  }
  const StragglerTracker::Report r = n.Stragglers();
  EXPECT_EQ(r.steps, 4);  // the fifth is still going
  EXPECT_EQ(r.step_time, absl::Milliseconds(100));
  ASSERT_EQ(r.ranks.size(), 3u);
  EXPECT_EQ(r.ranks[0].behind_first, absl::ZeroDuration());
  EXPECT_EQ(r.ranks[1].behind_first, absl::Milliseconds(2));
  EXPECT_EQ(r.ranks[2].behind_first, absl::Milliseconds(50));
  EXPECT_EQ(r.ranks[2].behind_median, absl::Milliseconds(48));
  EXPECT_EQ(r.straggler, 2);
  EXPECT_FALSE(r.ranks[1].flagged);
}

}  // namespace
}  // namespace ringmaster
