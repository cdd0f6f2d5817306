#include "coordinator/scheduler.h"

#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster {
namespace {

using ::testing::ElementsAre;

Worker MakeWorker(std::string id, std::string host, std::string device) {
  Worker w;
  w.id = std::move(id);
  w.host = std::move(host);
  w.device = std::move(device);
  w.state = WorkerState::kIdle;
  w.connected = true;
  return w;
}

// (rank, worker, host, device, local_rank, local_size, cross_rank, cross_size)
using Placed = std::tuple<int, std::string, std::string, std::string, int, int, int, int>;

std::vector<Placed> Placement(const std::vector<RankInfo>& ranks) {
  std::vector<Placed> out;
  for (const RankInfo& r : ranks) {
    out.emplace_back(r.rank, r.worker_id, r.host, r.device, r.local_rank, r.local_size,
                     r.cross_rank, r.cross_size);
  }
  return out;
}

TEST(PlaceClaimedTest, RanksGoWhereTheyWereClaimedWithHorovodsLocalAndCrossRanks) {
  // Interleaved hosts: ranks 0 and 2 on host-b, 1 and 3 on host-a, 4 alone on host-c.
  const std::vector<Worker> claimed = {
      MakeWorker("w1", "host-b", "cpu"), MakeWorker("w2", "host-a", "cpu"),
      MakeWorker("w3", "host-b", "cpu"), MakeWorker("w4", "host-a", "cpu"),
      MakeWorker("w5", "host-c", "cpu")};
  absl::StatusOr<std::vector<RankInfo>> ranks = PlaceClaimed(claimed);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  EXPECT_THAT(Placement(*ranks), ElementsAre(Placed{0, "w1", "host-b", "cpu", 0, 2, 0, 3},
                                             Placed{1, "w2", "host-a", "cpu", 0, 2, 1, 3},
                                             Placed{2, "w3", "host-b", "cpu", 1, 2, 0, 2},
                                             Placed{3, "w4", "host-a", "cpu", 1, 2, 1, 2},
                                             Placed{4, "w5", "host-c", "cpu", 0, 1, 2, 3}));
}

TEST(PlaceClaimedTest, AWorkerHoldingTwoRanksIsRefused) {
  absl::StatusOr<std::vector<RankInfo>> ranks =
      PlaceClaimed({MakeWorker("w1", "host-a", "cpu"), MakeWorker("w1", "host-a", "cpu")});
  EXPECT_EQ(ranks.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ranks.status().message(), "worker w1 on host-a claimed both rank 0 and rank 1");
}

TEST(GangScheduleTest, TwoHostsOfTwoFollowHorovodsRankLayout) {
  // Listed out of order on purpose: placement must not depend on the input order.
  const std::vector<Worker> available = {
      MakeWorker("w1", "host-b", "cuda:1"), MakeWorker("w2", "host-a", "cuda:10"),
      MakeWorker("w3", "host-a", "cuda:2"), MakeWorker("w4", "host-b", "cuda:0")};
  absl::StatusOr<std::vector<RankInfo>> ranks = GangSchedule(available, 4, 0);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  EXPECT_THAT(Placement(*ranks), ElementsAre(Placed{0, "w3", "host-a", "cuda:2", 0, 2, 0, 2},
                                             Placed{1, "w2", "host-a", "cuda:10", 1, 2, 0, 2},
                                             Placed{2, "w4", "host-b", "cuda:0", 0, 2, 1, 2},
                                             Placed{3, "w1", "host-b", "cuda:1", 1, 2, 1, 2}));
  for (const RankInfo& r : *ranks) {
    EXPECT_EQ(r.state, RankState::kAssigned);
    EXPECT_EQ(r.exit_code, 0);
  }
}

TEST(GangScheduleTest, UnevenHostsGetHorovodsLocalAndCrossRanks) {
  const std::vector<Worker> available = {
      MakeWorker("w1", "host-a", "cuda:0"), MakeWorker("w2", "host-a", "cuda:1"),
      MakeWorker("w3", "host-a", "cuda:2"), MakeWorker("w4", "host-b", "cuda:0")};
  absl::StatusOr<std::vector<RankInfo>> ranks = GangSchedule(available, 4, 0);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  // local_rank 0 exists on both hosts; local_ranks 1 and 2 only on host-a.
  EXPECT_THAT(Placement(*ranks), ElementsAre(Placed{0, "w1", "host-a", "cuda:0", 0, 3, 0, 2},
                                             Placed{1, "w2", "host-a", "cuda:1", 1, 3, 0, 1},
                                             Placed{2, "w3", "host-a", "cuda:2", 2, 3, 0, 1},
                                             Placed{3, "w4", "host-b", "cuda:0", 0, 1, 1, 2}));
}

TEST(GangScheduleTest, FillsTheHostsWithTheMostWorkersFirst) {
  const std::vector<Worker> available = {
      MakeWorker("a1", "host-a", "cuda:0"), MakeWorker("b1", "host-b", "cuda:0"),
      MakeWorker("b2", "host-b", "cuda:1"), MakeWorker("c1", "host-c", "cuda:0"),
      MakeWorker("c2", "host-c", "cuda:1"), MakeWorker("c3", "host-c", "cuda:2")};

  absl::StatusOr<std::vector<RankInfo>> three = GangSchedule(available, 3, 0);
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_THAT(Placement(*three), ElementsAre(Placed{0, "c1", "host-c", "cuda:0", 0, 3, 0, 1},
                                             Placed{1, "c2", "host-c", "cuda:1", 1, 3, 0, 1},
                                             Placed{2, "c3", "host-c", "cuda:2", 2, 3, 0, 1}));

  // Four: all of host-c, then one of host-b (more workers than host-a); ranks in host order.
  absl::StatusOr<std::vector<RankInfo>> four = GangSchedule(available, 4, 0);
  ASSERT_TRUE(four.ok()) << four.status();
  EXPECT_THAT(Placement(*four), ElementsAre(Placed{0, "b1", "host-b", "cuda:0", 0, 1, 0, 2},
                                            Placed{1, "c1", "host-c", "cuda:0", 0, 3, 1, 2},
                                            Placed{2, "c2", "host-c", "cuda:1", 1, 3, 0, 1},
                                            Placed{3, "c3", "host-c", "cuda:2", 2, 3, 0, 1}));
}

TEST(GangScheduleTest, EqualHostsAreTakenInNameOrder) {
  const std::vector<Worker> available = {
      MakeWorker("w1", "host-b", "cuda:0"), MakeWorker("w2", "host-b", "cuda:1"),
      MakeWorker("w3", "host-a", "cuda:0"), MakeWorker("w4", "host-a", "cuda:1")};
  absl::StatusOr<std::vector<RankInfo>> ranks = GangSchedule(available, 2, 0);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  EXPECT_THAT(Placement(*ranks), ElementsAre(Placed{0, "w3", "host-a", "cuda:0", 0, 2, 0, 1},
                                             Placed{1, "w4", "host-a", "cuda:1", 1, 2, 0, 1}));
}

TEST(GangScheduleTest, AtMostProcessesPerHostOnEachHost) {
  const std::vector<Worker> available = {
      MakeWorker("a0", "host-a", "cuda:0"), MakeWorker("a1", "host-a", "cuda:1"),
      MakeWorker("a2", "host-a", "cuda:2"), MakeWorker("b0", "host-b", "cuda:0"),
      MakeWorker("b1", "host-b", "cuda:1"), MakeWorker("b2", "host-b", "cuda:2")};
  absl::StatusOr<std::vector<RankInfo>> ranks = GangSchedule(available, 4, 2);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  EXPECT_THAT(Placement(*ranks), ElementsAre(Placed{0, "a0", "host-a", "cuda:0", 0, 2, 0, 2},
                                             Placed{1, "a1", "host-a", "cuda:1", 1, 2, 0, 2},
                                             Placed{2, "b0", "host-b", "cuda:0", 0, 2, 1, 2},
                                             Placed{3, "b1", "host-b", "cuda:1", 1, 2, 1, 2}));

  absl::StatusOr<std::vector<RankInfo>> too_many = GangSchedule(available, 3, 1);
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(too_many.status().message(),
            "needs 3 idle workers with at most 1 per host; 2 usable of 6 idle on 2 hosts");
}

TEST(GangScheduleTest, DevicesSortNumericallyAndCpuFirst) {
  const std::vector<Worker> available = {
      MakeWorker("w1", "host-a", "cuda:10"), MakeWorker("w2", "host-a", "cuda:2"),
      MakeWorker("w3", "host-a", "cuda:1"), MakeWorker("w5", "host-a", "cpu"),
      MakeWorker("w4", "host-a", "cpu")};
  absl::StatusOr<std::vector<RankInfo>> ranks = GangSchedule(available, 5, 0);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  std::vector<std::pair<std::string, std::string>> order;
  for (const RankInfo& r : *ranks) order.emplace_back(r.worker_id, r.device);
  // Equal devices fall back to the worker id.
  EXPECT_THAT(order, ElementsAre(std::pair<std::string, std::string>("w4", "cpu"),
                                 std::pair<std::string, std::string>("w5", "cpu"),
                                 std::pair<std::string, std::string>("w3", "cuda:1"),
                                 std::pair<std::string, std::string>("w2", "cuda:2"),
                                 std::pair<std::string, std::string>("w1", "cuda:10")));
}

TEST(GangScheduleTest, GangThatDoesNotFitIsRefusedWhole) {
  const std::vector<Worker> available = {MakeWorker("w1", "host-a", "cuda:0"),
                                         MakeWorker("w2", "host-a", "cuda:1")};
  absl::StatusOr<std::vector<RankInfo>> ranks = GangSchedule(available, 3, 0);
  EXPECT_EQ(ranks.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ranks.status().message(), "needs 3 idle workers; 2 usable of 2 idle on 1 hosts");

  absl::StatusOr<std::vector<RankInfo>> none = GangSchedule({}, 1, 0);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(none.status().message(), "needs 1 idle workers; 0 usable of 0 idle on 0 hosts");
}

TEST(GangScheduleTest, SingleRank) {
  absl::StatusOr<std::vector<RankInfo>> ranks =
      GangSchedule({MakeWorker("w1", "host-a", "cpu")}, 1, 0);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  EXPECT_THAT(Placement(*ranks), ElementsAre(Placed{0, "w1", "host-a", "cpu", 0, 1, 0, 1}));
}

TEST(WaitingReasonTest, CountsRegisteredAndIdleSlotsOfTheJobsKind) {
  EXPECT_EQ(WaitingReason({}, 16, 0, Backend::kAuto),
            "needs 16 idle cpu slots; 0 registered, 0 idle");
  Worker busy = MakeWorker("w1", "h0", "cpu");
  busy.state = WorkerState::kBusy;
  Worker away = MakeWorker("w2", "h0", "cpu");
  away.connected = false;
  Worker lost = MakeWorker("w3", "h0", "cpu");
  lost.state = WorkerState::kLost;
  const std::vector<Worker> workers = {busy, away, lost, MakeWorker("w4", "h1", "cpu")};
  EXPECT_EQ(WaitingReason(workers, 2, 0, Backend::kAuto),
            "needs 2 idle cpu slots; 3 registered, 1 idle");
  EXPECT_EQ(WaitingReason(workers, 1, 0, Backend::kAuto), "");
  EXPECT_EQ(WaitingReason({MakeWorker("g0", "h0", "cuda:0")}, 1, 0, Backend::kNccl), "");
  EXPECT_EQ(WaitingReason({MakeWorker("g0", "h0", "cuda:0")}, 2, 0, Backend::kAuto),
            "needs 2 idle gpu slots; 1 registered, 1 idle");
  EXPECT_EQ(WaitingReason({MakeWorker("g0", "h0", "cuda:0"), MakeWorker("c0", "h0", "cpu")}, 3, 0,
                          Backend::kAuto),
            "needs 3 idle slots; 2 registered, 2 idle");
  EXPECT_EQ(WaitingReason({}, 1, 0, Backend::kNccl), "needs 1 idle gpu slot; 0 registered, 0 idle");
  // An NCCL job is placed on GPU slots only: idle CPU slots do not count for it.
  EXPECT_EQ(WaitingReason({MakeWorker("c0", "h0", "cpu")}, 1, 0, Backend::kNccl),
            "needs 1 idle gpu slot; 1 registered, 0 idle");
}

TEST(SlotsForTest, AnNcclJobGetsGpuSlotsOnlyAndOthersAnySlot) {
  const std::vector<Worker> workers = {MakeWorker("c0", "h0", "cpu"),
                                       MakeWorker("g0", "h0", "cuda:0"),
                                       MakeWorker("g1", "h1", "cuda:1")};
  auto ids = [](const std::vector<Worker>& ws) {
    std::vector<std::string> out;
    for (const Worker& w : ws) out.push_back(w.id);
    return out;
  };
  EXPECT_THAT(ids(SlotsFor(workers, Backend::kNccl)), ElementsAre("g0", "g1"));
  EXPECT_THAT(ids(SlotsFor(workers, Backend::kGloo)), ElementsAre("c0", "g0", "g1"));
  EXPECT_THAT(ids(SlotsFor(workers, Backend::kAuto)), ElementsAre("c0", "g0", "g1"));
}

TEST(WaitingReasonTest, SaysWhenThePerHostLimitLeavesTooFewUsable) {
  const std::vector<Worker> one_host = {
      MakeWorker("w1", "h0", "cpu"), MakeWorker("w2", "h0", "cpu"), MakeWorker("w3", "h0", "cpu")};
  EXPECT_EQ(WaitingReason(one_host, 2, 1, Backend::kGloo),
            "needs 2 idle cpu slots (at most 1 per host); 3 registered, 3 idle on 1 host, 1 usable "
            "with at most 1 per host");
  EXPECT_EQ(WaitingReason(one_host, 2, 2, Backend::kGloo), "");
}

}  // namespace
}  // namespace ringmaster
