#include "coordinator/straggler_tracker.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace ringmaster {
namespace {

constexpr absl::Duration ms = absl::Milliseconds(1);

// A step of `tensors` tensors: each rank asks for tensor i `late_ms[rank] * (i + 1) / tensors`
// after the first rank did; the step takes `step` from its first tensor's first request to the
// next step's.
absl::Time Step(StragglerTracker& t, absl::Time start, int tensors, std::vector<int> late_ms,
                absl::Duration step) {
  for (int i = 0; i < tensors; ++i) {
    t.TensorStarted(absl::StrCat("grad.", i), start + step * i / tensors);
    for (size_t r = 0; r < late_ms.size(); ++r) {
      t.Requested(static_cast<int>(r), late_ms[r] * ms * (i + 1) / tensors);
    }
  }
  return start + step;
}

TEST(StragglerTrackerTest, NamesTheRankLateEveryStepByItsMedianLatenessBehindTheMedianRank) {
  StragglerTracker t({.ranks = 4, .window = 5});
  absl::Time now = absl::UnixEpoch();
  EXPECT_EQ(t.Window().steps, 0);
  // Rank 2 is 300 ms late every step; the others within 2 ms of each other. A step ends when
  // grad.0 is asked for again: the sixth is still going.
  for (int s = 0; s < 6; ++s) now = Step(t, now, 3, {0, 1, 300, 2}, absl::Milliseconds(500));
  EXPECT_EQ(t.steps(), 5);
  const StragglerTracker::Report r = t.Window();
  EXPECT_EQ(r.steps, 5);  // the window
  EXPECT_EQ(r.step_time, absl::Milliseconds(500));
  ASSERT_EQ(r.ranks.size(), 4u);
  EXPECT_EQ(r.ranks[0].behind_first, absl::ZeroDuration());
  EXPECT_EQ(r.ranks[1].behind_first, absl::Milliseconds(1));
  EXPECT_EQ(r.ranks[2].behind_first, absl::Milliseconds(300));
  EXPECT_EQ(r.ranks[3].behind_first, absl::Milliseconds(2));
  // The median rank is 1.5 ms behind the first (the mean of ranks 1 and 3).
  EXPECT_EQ(r.ranks[2].behind_median, absl::Microseconds(298500));
  EXPECT_EQ(r.ranks[3].behind_median, absl::Microseconds(500));
  EXPECT_EQ(r.ranks[0].behind_median, absl::ZeroDuration());
  EXPECT_TRUE(r.ranks[2].flagged);
  EXPECT_FALSE(r.ranks[0].flagged || r.ranks[1].flagged || r.ranks[3].flagged);
  EXPECT_EQ(r.straggler, 2);
}

TEST(StragglerTrackerTest, NoRankIsNamedWhenNoneIsLateBeyondTheThresholds) {
  StragglerTracker t(
      {.ranks = 4, .window = 5, .min_lateness = absl::Milliseconds(5), .step_fraction = 0.1});
  absl::Time now = absl::UnixEpoch();
  // Rank 3 is 4 ms behind (under min_lateness), then 40 ms in steps of 500 ms (under 10 %).
  for (int s = 0; s < 5; ++s) now = Step(t, now, 4, {0, 1, 1, 4}, absl::Milliseconds(500));
  StragglerTracker::Report r = t.Window();
  EXPECT_EQ(r.steps, 4);
  EXPECT_EQ(r.straggler, -1);
  EXPECT_EQ(r.ranks[3].behind_median, absl::Milliseconds(3));
  EXPECT_FALSE(r.ranks[3].flagged);
  // The window is the fifth 4 ms step and four 40 ms ones: the median is 40.
  for (int s = 0; s < 5; ++s) now = Step(t, now, 4, {0, 1, 1, 40}, absl::Milliseconds(500));
  r = t.Window();
  EXPECT_EQ(r.ranks[3].behind_median, absl::Milliseconds(39));
  EXPECT_EQ(r.straggler, -1);
  // 60 ms in steps of 500 ms is over both.
  for (int s = 0; s < 5; ++s) now = Step(t, now, 4, {0, 1, 1, 60}, absl::Milliseconds(500));
  EXPECT_EQ(t.Window().straggler, 3);
  EXPECT_EQ(t.Window().ranks[3].behind_median, absl::Milliseconds(59));
}

TEST(StragglerTrackerTest, NoRankIsNamedBeforeThreeStepsAreInTheWindow) {
  StragglerTracker t({.ranks = 3, .window = 10});
  absl::Time now = absl::UnixEpoch();
  now = Step(t, now, 2, {0, 0, 300}, absl::Milliseconds(400));
  now = Step(t, now, 2, {0, 0, 300}, absl::Milliseconds(400));
  now = Step(t, now, 2, {0, 0, 300}, absl::Milliseconds(400));  // ends the second step
  EXPECT_EQ(t.Window().steps, 2);
  EXPECT_EQ(t.Window().ranks[2].behind_median, absl::Milliseconds(300));
  EXPECT_FALSE(t.Window().ranks[2].flagged);
  EXPECT_EQ(t.Window().straggler, -1);
  Step(t, now, 2, {0, 0, 300}, absl::Milliseconds(400));  // ends the third
  EXPECT_EQ(t.Window().steps, 3);
  EXPECT_EQ(t.Window().straggler, 2);
}

TEST(StragglerTrackerTest, AStepEndsWhereItsFirstTensorIsAskedForAgainNamingItsLastRank) {
  StragglerTracker t({.ranks = 3, .window = 4});
  const absl::Time t0 = absl::UnixEpoch();
  EXPECT_FALSE(t.TensorStarted("a", t0).has_value());
  t.Requested(0, absl::ZeroDuration());
  t.Requested(1, absl::Milliseconds(7));
  t.Requested(2, absl::Milliseconds(3));
  EXPECT_FALSE(t.TensorStarted("b", t0 + absl::Milliseconds(10)).has_value());
  t.Requested(1, absl::ZeroDuration());
  t.Requested(0, absl::Milliseconds(2));
  t.Requested(2, absl::Milliseconds(9));
  const std::optional<StragglerTracker::StepEnd> end =
      t.TensorStarted("a", t0 + absl::Milliseconds(40));
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->step, 1);
  EXPECT_EQ(end->last_rank, 2);  // its largest lateness, 9 ms, beats rank 1's 7 ms
  EXPECT_EQ(end->lateness, absl::Milliseconds(9));
  EXPECT_EQ(end->duration, absl::Milliseconds(40));
  const StragglerTracker::Report r = t.Window();
  EXPECT_EQ(r.steps, 1);
  EXPECT_EQ(r.ranks[0].behind_first, absl::Milliseconds(2));
  EXPECT_EQ(r.ranks[1].behind_first, absl::Milliseconds(7));
  EXPECT_EQ(r.ranks[2].behind_first, absl::Milliseconds(9));
}

TEST(StragglerTrackerTest, OneOffTensorsBeforeTheLoopCountInTheFirstStepAndStepsEndAfterIt) {
  // A Python job: init's allgather and the parameters' broadcast once, then a loop of two tensors.
  StragglerTracker t({.ranks = 2, .window = 4});
  const absl::Time t0 = absl::UnixEpoch();
  int64_t ms = 0;
  auto start = [&](const std::string& name) {
    return t.TensorStarted(name, t0 + absl::Milliseconds(ms += 10));
  };
  EXPECT_FALSE(start("ringmaster.init.local_sizes").has_value());
  EXPECT_FALSE(start("broadcast.weight").has_value());
  EXPECT_FALSE(start("weight").has_value());
  EXPECT_FALSE(start("check_host_updates").has_value());
  // "weight" again: the first step (the one-offs and the loop's first) ends; the next begins.
  std::optional<StragglerTracker::StepEnd> end = start("weight");
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->step, 1);
  EXPECT_EQ(end->duration, absl::Milliseconds(40));
  EXPECT_FALSE(start("check_host_updates").has_value());
  end = start("weight");
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->step, 2);
  EXPECT_EQ(end->duration, absl::Milliseconds(20));
}

TEST(StragglerTrackerTest, NamesThatNeverRepeatEndAStepEveryMaxStepTensors) {
  StragglerTracker t({.ranks = 2, .window = 2});
  const absl::Time t0 = absl::UnixEpoch();
  int ended = 0;
  for (int64_t i = 0; i <= 2 * StragglerTracker::kMaxStepTensors; ++i) {
    if (t.TensorStarted(absl::StrCat("allreduce.noname.", i), t0 + absl::Microseconds(i))) {
      ++ended;
    }
  }
  EXPECT_EQ(ended, 2);
  EXPECT_EQ(t.steps(), 2);
}

TEST(StragglerTrackerTest, EveryFourthTensorOfAStepIsSampledItsFirstIncluded) {
  StragglerTracker t({.ranks = 2});
  const absl::Time t0 = absl::UnixEpoch();
  std::vector<int> sampled;
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 10; ++i) {
      t.TensorStarted(absl::StrCat("grad.", i), t0 + absl::Milliseconds(round * 100 + i));
      if (t.Sampled()) sampled.push_back(round * 100 + i);
    }
  }
  // A step of 10 tensors: 0, 4 and 8; again from the next step's first.
  EXPECT_EQ(sampled, (std::vector<int>{0, 4, 8, 100, 104, 108}));
}

TEST(StragglerTrackerTest, MemoryIsTheWindowWhateverTheJobRuns) {
  // 1024 ranks, a window of 10: the window holds 10 steps however many end.
  StragglerTracker t({.ranks = 1024, .window = 10});
  absl::Time now = absl::UnixEpoch();
  std::vector<int> late(1024, 0);
  late[777] = 50;
  for (int s = 0; s < 100; ++s) now = Step(t, now, 2, late, absl::Milliseconds(200));
  const StragglerTracker::Report r = t.Window();
  EXPECT_EQ(t.steps(), 99);
  EXPECT_EQ(r.steps, 10);
  EXPECT_EQ(r.straggler, 777);
  EXPECT_EQ(r.ranks[777].behind_median, absl::Milliseconds(50));
}

}  // namespace
}  // namespace ringmaster
