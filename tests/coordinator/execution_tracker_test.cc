#include "coordinator/execution_tracker.h"

#include <vector>

#include "gtest/gtest.h"

namespace ringmaster {
namespace {

constexpr int64_t kSecond = 1'000'000'000;
constexpr int64_t kMB = 1'000'000;

// Rank totals after `seconds` of a job in which, each second, the rank's collectives take
// `collective_ms` of which `network_ms` across hosts, and its connections send `mb_per_s` MB, the
// last report's delivery-rate sample being `rate_mb` MB/s.
ExecutionTracker::Sample After(int seconds, int collective_ms, int network_ms, int mb_per_s,
                               int rate_mb) {
  return {.elapsed_ns = seconds * kSecond,
          .collectives = seconds * 10,
          .collective_ns = int64_t{seconds} * collective_ms * 1'000'000,
          .network_ns = int64_t{seconds} * network_ms * 1'000'000,
          .link_bytes_sent = int64_t{seconds} * mb_per_s * kMB,
          .link_busy_ns = int64_t{seconds} * 100'000'000,
          .link_delivery_rate = int64_t{rate_mb} * kMB};
}

TEST(ExecutionTrackerTest, NamesTheHostWhoseLinkCarriesAFractionOfTheOtherHostsRate) {
  ExecutionTracker t({.ranks = 6, .hosts = {0, 0, 1, 1, 2, 2}, .window = 10});
  // Ranks 2 and 3 share a host whose link carries 5 MB/s; the other hosts' carry 1 to 3 GB/s.
  // Every rank's collectives take 700 ms a second, 600 of them across hosts: everyone waits on
  // the slow link.
  const std::vector<int> rates = {3000, 2000, 5, 4, 1000, 1200};
  for (int s = 0; s <= 5; ++s) {
    for (int r = 0; r < 6; ++r) {
      ASSERT_TRUE(t.Reported(r, After(s, 700, 600, 12, rates[r] - (s % 2))).ok());
    }
  }
  const ExecutionTracker::Report r = t.Window();
  ASSERT_EQ(r.ranks.size(), 6u);
  EXPECT_TRUE(r.ranks[0].measured);
  EXPECT_DOUBLE_EQ(r.ranks[0].collective_share, 0.7);
  EXPECT_DOUBLE_EQ(r.ranks[0].network_share, 0.6);
  // A max filter over the reports: the highest sample.
  EXPECT_DOUBLE_EQ(r.ranks[0].link_bytes_per_second, 3000e6);
  EXPECT_DOUBLE_EQ(r.ranks[3].link_bytes_per_second, 4e6);
  // Each host's rate is the median of its ranks'; the others' median, of the other hosts'.
  EXPECT_DOUBLE_EQ(r.ranks[3].host_link_bytes_per_second, 4.5e6);
  EXPECT_DOUBLE_EQ(r.ranks[3].others_link_bytes_per_second, (2500e6 + 1100e6) / 2);
  EXPECT_DOUBLE_EQ(r.ranks[0].others_link_bytes_per_second, (4.5e6 + 1100e6) / 2);
  const std::vector<bool> named = {false, false, true, true, false, false};
  for (int k = 0; k < 6; ++k) EXPECT_EQ(r.ranks[k].slow_link, named[k]) << "rank " << k;
  EXPECT_EQ(r.slowest_link, 3);  // its host's rank with the lowest rate
}

TEST(ExecutionTrackerTest, NamesNoHostWhenTheRatesAreWithinThreeTimesOrTheLinkCostsTheJobLittle) {
  // Two hosts, one carrying 2.5 times the other's rate.
  ExecutionTracker alike({.ranks = 2});
  for (int s = 0; s <= 3; ++s) {
    ASSERT_TRUE(alike.Reported(0, After(s, 500, 400, 50, 500)).ok());
    ASSERT_TRUE(alike.Reported(1, After(s, 500, 400, 50, 200)).ok());
  }
  const ExecutionTracker::Report a = alike.Window();
  EXPECT_DOUBLE_EQ(a.ranks[1].host_link_bytes_per_second, 200e6);
  EXPECT_DOUBLE_EQ(a.ranks[1].others_link_bytes_per_second, 500e6);
  EXPECT_EQ(a.slowest_link, -1);

  // Rank 1's link carries a hundredth of the others' rate, but its collectives spend 5 % of the
  // time across hosts: not what holds the job back.
  ExecutionTracker cheap({.ranks = 3});
  for (int s = 0; s <= 3; ++s) {
    ASSERT_TRUE(cheap.Reported(0, After(s, 80, 50, 2, 1000)).ok());
    ASSERT_TRUE(cheap.Reported(1, After(s, 80, 50, 2, 10)).ok());
    ASSERT_TRUE(cheap.Reported(2, After(s, 80, 50, 2, 1000)).ok());
  }
  const ExecutionTracker::Report r = cheap.Window();
  EXPECT_DOUBLE_EQ(r.ranks[1].link_bytes_per_second, 10e6);
  EXPECT_DOUBLE_EQ(r.ranks[1].network_share, 0.05);
  EXPECT_FALSE(r.ranks[1].slow_link);
  EXPECT_EQ(r.slowest_link, -1);

  // One host: nothing to compare its rate with.
  ExecutionTracker one({.ranks = 2, .hosts = {0, 0}});
  for (int s = 0; s <= 3; ++s) {
    ASSERT_TRUE(one.Reported(0, After(s, 900, 800, 2, 1)).ok());
    ASSERT_TRUE(one.Reported(1, After(s, 900, 800, 2, 1000)).ok());
  }
  EXPECT_EQ(one.Window().ranks[0].others_link_bytes_per_second, 0);
  EXPECT_EQ(one.Window().slowest_link, -1);
}

TEST(ExecutionTrackerTest, ARateCountsOnlyFromReportsThatSentEnoughBytes) {
  ExecutionTracker t({.ranks = 2, .min_link_bytes = 4 * kMB});
  ASSERT_TRUE(t.Reported(0, After(1, 500, 400, 1, 100)).ok());
  ASSERT_TRUE(t.Reported(0, After(3, 500, 400, 1, 100)).ok());  // 2 MB since the last report
  ASSERT_TRUE(t.Reported(1, After(1, 500, 400, 1, 100)).ok());
  ExecutionTracker::Report r = t.Window();
  EXPECT_TRUE(r.ranks[0].measured);
  EXPECT_DOUBLE_EQ(r.ranks[0].collective_share, 0.5);
  EXPECT_EQ(r.ranks[0].link_bytes_per_second, 0);  // too few bytes to say
  EXPECT_EQ(r.ranks[0].host_link_bytes_per_second, 0);
  EXPECT_FALSE(r.ranks[1].measured);  // one report: no interval yet
  EXPECT_EQ(r.slowest_link, -1);
  ASSERT_TRUE(t.Reported(0, After(8, 500, 400, 1, 70)).ok());  // 5 MB since: its sample counts
  r = t.Window();
  EXPECT_DOUBLE_EQ(r.ranks[0].link_bytes_per_second, 70e6);
}

TEST(ExecutionTrackerTest, KeepsTheLastWindowOfReportsAndStartsAfreshWhenTotalsGoBack) {
  ExecutionTracker t({.ranks = 1, .window = 3});
  // Four seconds of everything in collectives at 900 MB/s, then three of half at 20 MB/s: the
  // window is the last three intervals.
  for (int s = 0; s <= 4; ++s) ASSERT_TRUE(t.Reported(0, After(s, 1000, 0, 10, 900)).ok());
  ExecutionTracker::Sample at = After(4, 1000, 0, 10, 900);
  for (int s = 1; s <= 3; ++s) {
    at.elapsed_ns += kSecond;
    at.collective_ns += kSecond / 2;
    at.link_bytes_sent += 10 * kMB;
    at.link_delivery_rate = 20 * kMB;
    ASSERT_TRUE(t.Reported(0, at).ok());
  }
  EXPECT_DOUBLE_EQ(t.Window().ranks[0].collective_share, 0.5);
  EXPECT_DOUBLE_EQ(t.Window().ranks[0].link_bytes_per_second, 20e6);
  // The worker's totals began again (a new executor): the old reports no longer count.
  ASSERT_TRUE(t.Reported(0, After(1, 200, 0, 0, 0)).ok());
  EXPECT_FALSE(t.Window().ranks[0].measured);
  ASSERT_TRUE(t.Reported(0, After(2, 200, 0, 0, 0)).ok());
  EXPECT_DOUBLE_EQ(t.Window().ranks[0].collective_share, 0.2);
}

TEST(ExecutionTrackerTest, RefusesARankOutOfRangeAndNegativeTotals) {
  ExecutionTracker t({.ranks = 2});
  absl::Status s = t.Reported(2, After(1, 1, 1, 1, 1));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "execution.rank 2 is not a rank of the job (0..1)");
  ExecutionTracker::Sample bad = After(1, 1, 1, 1, 1);
  bad.link_delivery_rate = -1;
  s = t.Reported(1, bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "execution of rank 1 has a negative total");
  EXPECT_FALSE(t.Window().ranks[1].measured);
}

}  // namespace
}  // namespace ringmaster
