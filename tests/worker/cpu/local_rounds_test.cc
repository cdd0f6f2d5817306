#include "worker/cpu/local_rounds.h"

#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace ringmaster {
namespace {

using Outcome = LocalRounds::Outcome;

constexpr absl::Duration kPatience = absl::Seconds(10);

bool Never() { return false; }

class LocalRoundsTest : public ::testing::Test {
 protected:
  LocalRounds& Rank(int rank, int size) {
    ranks_.push_back(std::make_unique<LocalRounds>(state_.get(), rank, size));
    return *ranks_.back();
  }
  // Each rank joins `ids[rank]` at `points[rank]` on its own thread, and goes to the coordinator
  // when diverted, as the engine does (saying so first); their outcomes.
  std::vector<Outcome> JoinAll(const std::vector<LocalPoint>& points,
                               const std::vector<uint32_t>& ids,
                               absl::Duration patience = kPatience) {
    const int n = static_cast<int>(ids.size());
    std::vector<LocalRounds*> rounds;
    for (int r = 0; r < n; ++r) rounds.push_back(&Rank(r, n));
    std::vector<Outcome> out(n, Outcome::kDiverted);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        out[r] = rounds[r]->Join(points[r], ids[r], absl::Now() + patience, Never);
        if (out[r] == Outcome::kDiverted) rounds[r]->Divert(points[r]);
      });
    }
    for (std::thread& t : threads) t.join();
    return out;
  }

  std::unique_ptr<LocalRoundState> state_ = std::make_unique<LocalRoundState>();
  std::vector<std::unique_ptr<LocalRounds>> ranks_;
};

TEST_F(LocalRoundsTest, EveryRankJoiningTheSameIdAtTheSamePointCompletesTheRound) {
  EXPECT_EQ(JoinAll({{3, 0}, {3, 0}, {3, 0}}, {7, 7, 7}),
            std::vector<Outcome>(3, Outcome::kCompleted));
}

TEST_F(LocalRoundsTest, ARankWithAnotherIdDivertsTheRoundForEveryone) {
  const absl::Time start = absl::Now();
  EXPECT_EQ(JoinAll({{0, 0}, {0, 0}, {0, 0}}, {5, 5, 6}),
            std::vector<Outcome>(3, Outcome::kDiverted));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST_F(LocalRoundsTest, RanksOutOfStepDivertEachOther) {
  // Rank 1 has processed a response list rank 0 has not: whichever comes second diverts the
  // first's round, and the first, going to the coordinator, diverts the second's.
  const absl::Time start = absl::Now();
  EXPECT_EQ(JoinAll({{1, 0}, {2, 0}}, {5, 5}), std::vector<Outcome>(2, Outcome::kDiverted));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST_F(LocalRoundsTest, ThousandsOfRoundsInARowCompleteInStep) {
  constexpr int kRounds = 3000;
  for (int n : {2, 3}) {
    state_ = std::make_unique<LocalRoundState>();
    std::vector<LocalRounds*> rounds;
    for (int r = 0; r < n; ++r) rounds.push_back(&Rank(r, n));
    std::vector<int> completed(n, 0);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        LocalPoint p;
        for (int i = 0; i < kRounds; ++i) {
          // Every 100th step a response list reaches every rank between rounds.
          if (i % 100 == 99) ++p.lists;
          if (rounds[r]->Join(p, 1 + i % 3, absl::Now() + kPatience, Never) ==
              Outcome::kCompleted) {
            ++completed[r];
            ++p.rounds;
          }
        }
      });
    }
    for (std::thread& t : threads) t.join();
    EXPECT_EQ(completed, std::vector<int>(n, kRounds)) << n << " ranks";
  }
}

TEST_F(LocalRoundsTest, ARankSendingToTheCoordinatorEndsTheWaitAtOnce) {
  LocalRounds& a = Rank(0, 2);
  LocalRounds& b = Rank(1, 2);
  const LocalPoint p{4, 2};
  absl::Notification joined;
  Outcome outcome = Outcome::kCompleted;
  const absl::Time start = absl::Now();
  std::thread waiter([&] { outcome = a.Join(p, 9, absl::Now() + kPatience, Never); });
  absl::SleepFor(absl::Milliseconds(20));
  b.Divert(p);
  waiter.join();
  EXPECT_EQ(outcome, Outcome::kDiverted);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  // Whoever comes to this point later goes to the coordinator too, at once.
  EXPECT_EQ(b.Join(p, 9, absl::Now() + kPatience, Never), Outcome::kDiverted);
  // The next point is a fresh round.
  EXPECT_EQ(JoinAll({{5, 2}, {5, 2}}, {9, 9}), std::vector<Outcome>(2, Outcome::kCompleted));
}

TEST_F(LocalRoundsTest, ARankThatSentAtAPointDivertsThoseThatComeThereLater) {
  // Rank 1 sends at point (1, 0); then rank 0, a list behind, sends at (0, 0). Rank 2, reaching
  // (1, 0) afterwards, must not wait there for rank 1, which will never join.
  LocalRounds& a = Rank(0, 3);
  LocalRounds& b = Rank(1, 3);
  LocalRounds& c = Rank(2, 3);
  b.Divert({1, 0});
  a.Divert({0, 0});
  const absl::Time start = absl::Now();
  EXPECT_EQ(c.Join({1, 0}, 4, absl::Now() + kPatience, Never), Outcome::kDiverted);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST_F(LocalRoundsTest, CacheIdsUpToTwentyFourBitsAreTold) {
  // Ranks posting ids that differ only above 16 bits do not complete a round together.
  EXPECT_EQ(JoinAll({{0, 0}, {0, 0}}, {0x10005, 0x20005}),
            std::vector<Outcome>(2, Outcome::kDiverted));
  EXPECT_EQ(JoinAll({{1, 0}, {1, 0}}, {LocalRounds::kMaxId, LocalRounds::kMaxId}),
            std::vector<Outcome>(2, Outcome::kCompleted));
}

TEST_F(LocalRoundsTest, ARankThatGivesUpDivertsTheRoundAndItsWakeEndsItsWait) {
  LocalRounds& a = Rank(0, 2);
  LocalRounds& b = Rank(1, 2);
  std::atomic<bool> more_work{false};
  Outcome outcome = Outcome::kCompleted;
  const absl::Time start = absl::Now();
  std::thread waiter([&] {
    outcome = a.Join({0, 0}, 3, absl::Now() + kPatience, [&] { return more_work.load(); });
  });
  absl::SleepFor(absl::Milliseconds(20));
  more_work = true;
  a.Wake();
  waiter.join();
  EXPECT_EQ(outcome, Outcome::kDiverted);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(b.Join({0, 0}, 3, absl::Now() + kPatience, Never), Outcome::kDiverted);
}

TEST_F(LocalRoundsTest, AWaitEndsAtItsDeadline) {
  LocalRounds& a = Rank(0, 2);
  const absl::Time start = absl::Now();
  EXPECT_EQ(a.Join({0, 0}, 3, start + absl::Milliseconds(30), Never), Outcome::kDiverted);
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(30));
  EXPECT_LT(took, absl::Seconds(2));
  // The late rank finds the round diverted instead of waiting in it alone.
  LocalRounds& b = Rank(1, 2);
  EXPECT_EQ(b.Join({0, 0}, 3, absl::Now() + kPatience, Never), Outcome::kDiverted);
}

}  // namespace
}  // namespace ringmaster
