#include "coordinator/execution_tracker.h"

#include <vector>

#include "gtest/gtest.h"

namespace ringmaster {
namespace {

constexpr int64_t kSecond = 1'000'000'000;
constexpr int64_t kMB = 1'000'000;

// Rank totals after `seconds` of a job in which, each second, the rank's collectives take
// `collective_ms` of which `network_ms` across hosts, and its connections send `mb_per_s` MB in
// `busy_ms` of busy time.
ExecutionTracker::Sample After(int seconds, int collective_ms, int network_ms, int mb_per_s,
                               int busy_ms) {
  return {.elapsed_ns = seconds * kSecond,
          .collectives = seconds * 10,
          .collective_ns = int64_t{seconds} * collective_ms * 1'000'000,
          .network_ns = int64_t{seconds} * network_ms * 1'000'000,
          .link_bytes_sent = int64_t{seconds} * mb_per_s * kMB,
          .link_busy_ns = int64_t{seconds} * busy_ms * 1'000'000};
}

TEST(ExecutionTrackerTest, NamesTheRankWhoseHostSendsAtAFractionOfTheMedianRate) {
  ExecutionTracker t({.ranks = 4, .window = 10});
  // Ranks 2 and 3 share a host whose link sends 12 MB in 1 s of busy time (12 MB/s); ranks 0
  // and 1 send the same bytes in 10 ms (1.2 GB/s). Every rank's collectives take 700 ms a second,
  // 600 of them across hosts: everyone waits on the slow link.
  for (int s = 0; s <= 5; ++s) {
    ASSERT_TRUE(t.Reported(0, After(s, 700, 600, 12, 10)).ok());
    ASSERT_TRUE(t.Reported(1, After(s, 700, 600, 12, 10)).ok());
    ASSERT_TRUE(t.Reported(2, After(s, 700, 600, 12, 1000)).ok());
    ASSERT_TRUE(t.Reported(3, After(s, 700, 600, 12, 500)).ok());
  }
  const ExecutionTracker::Report r = t.Window();
  ASSERT_EQ(r.ranks.size(), 4u);
  EXPECT_TRUE(r.ranks[0].measured);
  EXPECT_DOUBLE_EQ(r.ranks[0].collective_share, 0.7);
  EXPECT_DOUBLE_EQ(r.ranks[0].network_share, 0.6);
  EXPECT_DOUBLE_EQ(r.ranks[0].link_bytes_per_second, 1.2e9);
  EXPECT_DOUBLE_EQ(r.ranks[2].link_bytes_per_second, 12e6);
  EXPECT_DOUBLE_EQ(r.ranks[3].link_bytes_per_second, 24e6);
  // The median of 12, 24, 1200 and 1200 MB/s.
  EXPECT_DOUBLE_EQ(r.median_link_bytes_per_second, (24e6 + 1.2e9) / 2);
  EXPECT_FALSE(r.ranks[0].slow_link);
  EXPECT_FALSE(r.ranks[1].slow_link);
  EXPECT_TRUE(r.ranks[2].slow_link);
  EXPECT_TRUE(r.ranks[3].slow_link);
  EXPECT_EQ(r.slowest_link, 2);  // the lowest rate
}

TEST(ExecutionTrackerTest, NamesNoRankWhenTheRatesAreAlikeOrTheLinkCostsTheJobLittle) {
  ExecutionTracker alike({.ranks = 3});
  for (int s = 0; s <= 3; ++s) {
    for (int r = 0; r < 3; ++r)
      ASSERT_TRUE(alike.Reported(r, After(s, 500, 400, 50, 40 + r * 5)).ok());
  }
  EXPECT_EQ(alike.Window().slowest_link, -1);

  // Rank 1 sends at a hundredth of the others' rate, but its collectives spend 5 % of the time
  // across hosts: not what holds the job back.
  ExecutionTracker cheap({.ranks = 3});
  for (int s = 0; s <= 3; ++s) {
    ASSERT_TRUE(cheap.Reported(0, After(s, 80, 50, 2, 2)).ok());
    ASSERT_TRUE(cheap.Reported(1, After(s, 80, 50, 2, 200)).ok());
    ASSERT_TRUE(cheap.Reported(2, After(s, 80, 50, 2, 2)).ok());
  }
  const ExecutionTracker::Report r = cheap.Window();
  EXPECT_DOUBLE_EQ(r.ranks[1].link_bytes_per_second, 10e6);
  EXPECT_DOUBLE_EQ(r.ranks[1].network_share, 0.05);
  EXPECT_FALSE(r.ranks[1].slow_link);
  EXPECT_EQ(r.slowest_link, -1);
}

TEST(ExecutionTrackerTest, ARankWithOneReportOrTooFewBytesHasNoFigures) {
  ExecutionTracker t({.ranks = 2, .min_link_bytes = 4 * kMB});
  ASSERT_TRUE(t.Reported(0, After(1, 500, 400, 1, 100)).ok());
  ASSERT_TRUE(t.Reported(0, After(3, 500, 400, 1, 100)).ok());  // 2 MB over the window
  ASSERT_TRUE(t.Reported(1, After(1, 500, 400, 1, 100)).ok());
  const ExecutionTracker::Report r = t.Window();
  EXPECT_TRUE(r.ranks[0].measured);
  EXPECT_DOUBLE_EQ(r.ranks[0].collective_share, 0.5);
  EXPECT_EQ(r.ranks[0].link_bytes_per_second, 0);  // too few bytes to say
  EXPECT_FALSE(r.ranks[1].measured);               // one report: no interval yet
  EXPECT_EQ(r.median_link_bytes_per_second, 0);
  EXPECT_EQ(r.slowest_link, -1);
}

TEST(ExecutionTrackerTest, KeepsTheLastWindowOfReportsAndStartsAfreshWhenTotalsGoBack) {
  ExecutionTracker t({.ranks = 1, .window = 3});
  // Four seconds of everything in collectives, then three of half: the window is the last three
  // intervals.
  for (int s = 0; s <= 4; ++s) ASSERT_TRUE(t.Reported(0, After(s, 1000, 0, 0, 0)).ok());
  ExecutionTracker::Sample at = After(4, 1000, 0, 0, 0);
  for (int s = 1; s <= 3; ++s) {
    at.elapsed_ns += kSecond;
    at.collective_ns += kSecond / 2;
    ASSERT_TRUE(t.Reported(0, at).ok());
  }
  EXPECT_DOUBLE_EQ(t.Window().ranks[0].collective_share, 0.5);
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
  bad.link_busy_ns = -1;
  s = t.Reported(1, bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "execution of rank 1 has a negative total");
  EXPECT_FALSE(t.Window().ranks[1].measured);
}

}  // namespace
}  // namespace ringmaster
