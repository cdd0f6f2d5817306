// The exposition text is what Prometheus parses: checked to the byte.
#include "common/metrics.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace ringmaster {
namespace {

TEST(MetricsTest, ExpositionFollowsTheTextFormatExactly) {
  MetricsRegistry r;
  r.GetCounter("ringmaster_a_total", "Things that happened.", {{"op", "allreduce"}}).Increment(3);
  r.GetCounter("ringmaster_a_total", "ignored: the first help stays", {{"op", "broadcast"}});
  r.GetGauge("ringmaster_b", "A level\nwith a newline and a \\ backslash.").Set(0.25);
  Histogram& h =
      r.GetHistogram("ringmaster_c_seconds", "Durations.", {0.001, 0.01, 0.1}, {{"job", "j\"1"}});
  for (double v : {0.0005, 0.001, 0.05, 7.0}) h.Observe(v);
  EXPECT_EQ(r.Exposition(),
            "# HELP ringmaster_a_total Things that happened.\n"
            "# TYPE ringmaster_a_total counter\n"
            "ringmaster_a_total{op=\"allreduce\"} 3\n"
            "ringmaster_a_total{op=\"broadcast\"} 0\n"
            "# HELP ringmaster_b A level\\nwith a newline and a \\\\ backslash.\n"
            "# TYPE ringmaster_b gauge\n"
            "ringmaster_b 0.25\n"
            "# HELP ringmaster_c_seconds Durations.\n"
            "# TYPE ringmaster_c_seconds histogram\n"
            "ringmaster_c_seconds_bucket{job=\"j\\\"1\",le=\"0.001\"} 2\n"
            "ringmaster_c_seconds_bucket{job=\"j\\\"1\",le=\"0.01\"} 2\n"
            "ringmaster_c_seconds_bucket{job=\"j\\\"1\",le=\"0.1\"} 3\n"
            "ringmaster_c_seconds_bucket{job=\"j\\\"1\",le=\"+Inf\"} 4\n"
            "ringmaster_c_seconds_sum{job=\"j\\\"1\"} 7.0515\n"
            "ringmaster_c_seconds_count{job=\"j\\\"1\"} 4\n");
}

TEST(MetricsTest, CollectorsRefreshGaugesAtEachExposition) {
  MetricsRegistry r;
  int calls = 0;
  r.AddCollector([&] { r.GetGauge("ringmaster_calls", "Calls.").Set(++calls); });
  EXPECT_NE(r.Exposition().find("ringmaster_calls 1\n"), std::string::npos);
  EXPECT_NE(r.Exposition().find("ringmaster_calls 2\n"), std::string::npos);
}

TEST(MetricsTest, ConcurrentIncrementsAreAllCounted) {
  MetricsRegistry r;
  Counter& c = r.GetCounter("ringmaster_n_total", "N.");
  Histogram& h = r.GetHistogram("ringmaster_h", "H.", {1});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 100000; ++i) {
        c.Increment();
        h.Observe(0.5);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(c.value(), 400000);
  EXPECT_EQ(h.CumulativeCounts().back(), 400000u);
  EXPECT_EQ(h.sum(), 200000);
}

}  // namespace
}  // namespace ringmaster
