#include "coordinator/autotuner.h"

#include <cmath>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster {
namespace {

using ::testing::ElementsAre;
using ::testing::SizeIs;

constexpr int64_t kMiB = int64_t{1} << 20;

// A job whose every cycle is one training step of `distinct` tensors and `bytes` bytes, taking
// `step` of wall time. Returns whether the parameters changed.
struct Driver {
  Autotuner& tuner;
  absl::Time now = absl::FromUnixSeconds(1000);
  std::vector<AutotuneParameters> changes = {};

  void Step(int64_t bytes, int64_t distinct, absl::Duration step) {
    now += step;
    if (auto p = tuner.Observe(bytes, distinct, distinct, now)) changes.push_back(*p);
  }
};

TEST(AutotunerTest, ParameterMappingRoundTrips) {
  EXPECT_EQ(Autotuner::UnitToFusion(0), 64 * 1024);
  EXPECT_EQ(Autotuner::UnitToFusion(1), 256 * kMiB);
  EXPECT_EQ(Autotuner::UnitToFusion(Autotuner::FusionToUnit(32 * kMiB)), 32 * kMiB);
  EXPECT_DOUBLE_EQ(Autotuner::UnitToCycle(0), 1.0);
  EXPECT_DOUBLE_EQ(Autotuner::UnitToCycle(1), 50);
  EXPECT_DOUBLE_EQ(Autotuner::UnitToCycle(Autotuner::CycleToUnit(5)), 5);
  EXPECT_EQ(Autotuner::FusionToUnit(0), 0);  // fusion off maps to the low end
}

TEST(AutotunerTest, DiscardsWarmupSamplesThenScoresTheStartingSettingFirst) {
  AutotuneOptions o;
  o.warmup_samples = 2;
  o.steps_per_sample = 3;
  o.max_samples = 5;
  o.start = {64 * 1024, 1.0, true};
  Autotuner tuner(o);
  Driver d{tuner};
  // The first cycle only opens the sample; then 3 steps of 10 MB in 100 ms each close it.
  for (int sample = 0; sample < 2; ++sample) {
    d.Step(10'000'000, 4, absl::Milliseconds(100));
    d.Step(10'000'000, 4, absl::Milliseconds(100));
    d.Step(10'000'000, 4, absl::Milliseconds(100));
    if (sample == 0) d.Step(10'000'000, 4, absl::Milliseconds(100));  // opens the sample
  }
  EXPECT_EQ(tuner.status().phase, AutotunePhase::kTuning);
  EXPECT_EQ(tuner.status().samples, 0);
  EXPECT_TRUE(d.changes.empty());
  // Sample 0 (the starting setting): 3 steps of 20 MB in 200 ms each = 100 MB/s.
  for (int i = 0; i < 3; ++i) d.Step(20'000'000, 4, absl::Milliseconds(200));
  ASSERT_THAT(d.changes, SizeIs(1));
  EXPECT_EQ(tuner.status().samples, 1);
  EXPECT_DOUBLE_EQ(tuner.status().best_score, 1e8);
  EXPECT_EQ(tuner.status().best, o.start);
  EXPECT_NE(d.changes[0], o.start);
  EXPECT_EQ(tuner.status().current, d.changes[0]);
  EXPECT_THAT(tuner.TakeLog(), ElementsAre(kAutotuneLogHeader, "0,0,1,1,0.0625,100000000"));
  EXPECT_THAT(tuner.TakeLog(), SizeIs(0));
}

TEST(AutotunerTest, ASampleEndsAfterStepsPerSampleTimesTheDistinctTensors) {
  AutotuneOptions o;
  o.warmup_samples = 0;
  o.steps_per_sample = 2;
  o.max_samples = 3;
  Autotuner tuner(o);
  absl::Time now = absl::FromUnixSeconds(0);
  EXPECT_FALSE(tuner.Observe(0, 0, 10, now));  // opens the sample at t = 0
  // 19 tensors of a 10-tensor job: not two steps yet.
  EXPECT_FALSE(tuner.Observe(1000, 19, 10, now + absl::Seconds(1)));
  EXPECT_EQ(tuner.status().samples, 0);
  EXPECT_TRUE(tuner.Observe(1000, 1, 10, now + absl::Seconds(2)));
  EXPECT_EQ(tuner.status().samples, 1);
  EXPECT_DOUBLE_EQ(tuner.status().best_score, 1000.0);  // 2000 bytes in 2 s
}

// Throughput of a simulated job as a function of the parameters: best at a 32 MiB fusion threshold
// and 2 ms cycle time with the cache on; falls off on a log scale either side.
double Throughput(const AutotuneParameters& p) {
  const double f = std::log2(static_cast<double>(std::max<int64_t>(p.fusion_threshold_bytes, 1)) /
                             (32.0 * kMiB));
  const double c = std::log2(p.cycle_time_ms / 2.0);
  return 1e9 * std::exp(-0.08 * f * f - 0.15 * c * c) * (p.cache_enabled ? 1.0 : 0.9);
}

TEST(AutotunerTest, TunesASimulatedJobFromAPoorSettingToNearItsBest) {
  AutotuneOptions o;  // Horovod's defaults: 3 warm-up samples, 10 steps each, 20 samples, noise 0.8
  o.start = {64 * 1024, 1.0, true};
  Autotuner tuner(o);
  Driver d{tuner};
  AutotuneParameters in_force = o.start;
  const int64_t step_bytes = 100 * kMiB;
  for (int step = 0; step < 5000 && tuner.status().phase != AutotunePhase::kDone; ++step) {
    const double seconds = static_cast<double>(step_bytes) / Throughput(in_force);
    const size_t before = d.changes.size();
    d.Step(step_bytes, 161, absl::Seconds(seconds));
    if (d.changes.size() > before) in_force = d.changes.back();
  }
  const AutotuneStatus s = tuner.status();
  ASSERT_EQ(s.phase, AutotunePhase::kDone);
  EXPECT_EQ(s.samples, 20);
  EXPECT_EQ(in_force, s.best);  // the job settles on the best setting found
  EXPECT_GT(Throughput(s.best), 0.9 * 1e9)
      << s.best.fusion_threshold_bytes << " bytes, " << s.best.cycle_time_ms << " ms";
  EXPECT_LT(Throughput(o.start), 0.5 * 1e9);  // the start was poor indeed
  // Header, 20 samples, then the best setting.
  std::vector<std::string> log = tuner.TakeLog();
  ASSERT_THAT(log, SizeIs(22));
  std::vector<std::string> last = absl::StrSplit(log.back(), ',');
  ASSERT_THAT(last, SizeIs(6));
  EXPECT_EQ(last[2], s.best.cache_enabled ? "1" : "0");
}

TEST(AutotunerTest, FixedKnobsAreNeverMoved) {
  AutotuneOptions o;
  o.warmup_samples = 0;
  o.steps_per_sample = 1;
  o.max_samples = 8;
  o.start = {8 * kMiB, 3.0, false};
  o.tune_fusion_threshold = false;
  o.tune_cache = false;
  Autotuner tuner(o);
  Driver d{tuner};
  for (int i = 0; i < 40 && tuner.status().phase != AutotunePhase::kDone; ++i) {
    d.Step(kMiB, 1, absl::Milliseconds(10 + i % 7));
  }
  EXPECT_EQ(tuner.status().phase, AutotunePhase::kDone);
  ASSERT_FALSE(d.changes.empty());
  bool cycle_moved = false;
  for (const AutotuneParameters& p : d.changes) {
    EXPECT_EQ(p.fusion_threshold_bytes, 8 * kMiB);
    EXPECT_FALSE(p.cache_enabled);
    cycle_moved |= p.cycle_time_ms != 3.0;
  }
  EXPECT_TRUE(cycle_moved);
}

TEST(AutotunerTest, NothingToTuneWhenEveryKnobIsFixed) {
  AutotuneOptions o;
  o.tune_fusion_threshold = o.tune_cycle_time = o.tune_cache = false;
  Autotuner tuner(o);
  Driver d{tuner};
  for (int i = 0; i < 100; ++i) d.Step(kMiB, 1, absl::Milliseconds(10));
  EXPECT_EQ(tuner.status().phase, AutotunePhase::kDone);
  EXPECT_TRUE(d.changes.empty());
}

}  // namespace
}  // namespace ringmaster
