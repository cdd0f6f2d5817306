#include "worker/local/rank_attachment.h"

#include <thread>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace ringmaster {
namespace {

absl::Status Welcomed() { return absl::OkStatus(); }

TEST(RankAttachmentTest, OneProcessPerRankOverAnyNumberOfItsConnections) {
  RankAttachment a;
  EXPECT_EQ(a.pid(), 0);
  ASSERT_TRUE(a.Admit(100, "rank 1 of job j", absl::ZeroDuration(), Welcomed).ok());
  ASSERT_TRUE(a.Admit(100, "rank 1 of job j", absl::ZeroDuration(), Welcomed).ok());
  EXPECT_EQ(a.pid(), 100);
  EXPECT_EQ(a.connections(), 2);
  int welcomed = 0;
  const absl::Status other = a.Admit(200, "rank 1 of job j", absl::Milliseconds(20), [&] {
    ++welcomed;
    return absl::OkStatus();
  });
  EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(other.message(),
            "rank 1 of job j already has a training process attached (pid 100): one process per "
            "rank (a process started by the training process, such as a DataLoader worker, must "
            "not call init())");
  EXPECT_EQ(welcomed, 0);   // nothing of the rank handed to it
  EXPECT_FALSE(a.Leave());  // one of its two connections
  EXPECT_EQ(a.pid(), 100);
  EXPECT_TRUE(a.Leave());  // its last: detached
  EXPECT_EQ(a.pid(), 0);
  EXPECT_FALSE(a.Leave());  // nothing left to leave
  ASSERT_TRUE(a.Admit(200, "rank 1 of job j", absl::ZeroDuration(), Welcomed).ok());
  EXPECT_EQ(a.pid(), 200);
}

TEST(RankAttachmentTest, ProcessesOfUnknownPidAreNeverTakenForTheAttachedOne) {
  RankAttachment a;
  ASSERT_TRUE(a.Admit(-1, "rank 0 of job j", absl::ZeroDuration(), Welcomed).ok());
  const absl::Status second = a.Admit(-1, "rank 0 of job j", absl::ZeroDuration(), Welcomed);
  EXPECT_EQ(second.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(second.message(),
            "rank 0 of job j already has a training process attached: one process per rank (a "
            "process started by the training process, such as a DataLoader worker, must not call "
            "init())");
}

TEST(RankAttachmentTest, ANewProcessWaitsForTheLastConnectionOfTheOneBeforeToBeSeenGoing) {
  RankAttachment a;
  ASSERT_TRUE(a.Admit(100, "rank 0 of job j", absl::ZeroDuration(), Welcomed).ok());
  std::thread leaver([&] {
    absl::SleepFor(absl::Milliseconds(100));
    a.Leave();
  });
  const absl::Time start = absl::Now();
  const absl::Status s = a.Admit(200, "rank 0 of job j", absl::Seconds(10), Welcomed);
  const absl::Duration waited = absl::Now() - start;
  leaver.join();
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(a.pid(), 200);
  EXPECT_GE(waited, absl::Milliseconds(90));
  EXPECT_LT(waited, absl::Seconds(5));  // woken by the leave, not by the deadline
}

TEST(RankAttachmentTest, AFailedWelcomeAdmitsNothingAndAClosedRankAdmitsNoOne) {
  RankAttachment a;
  const absl::Status failed = a.Admit(100, "rank 0 of job j", absl::ZeroDuration(), [] {
    return absl::UnavailableError("cannot share the job's arena: Too many open files");
  });
  EXPECT_EQ(failed, absl::UnavailableError("cannot share the job's arena: Too many open files"));
  EXPECT_EQ(a.pid(), 0);
  EXPECT_EQ(a.connections(), 0);
  a.Close();
  int welcomed = 0;
  const absl::Status closed = a.Admit(100, "rank 0 of job j", absl::ZeroDuration(), [&] {
    ++welcomed;
    return absl::OkStatus();
  });
  EXPECT_EQ(closed, absl::UnavailableError("no job is assigned to this worker yet"));
  EXPECT_EQ(welcomed, 0);
}

TEST(RankAttachmentTest, ClosingWakesAProcessWaitingForTheOneBefore) {
  RankAttachment a;
  ASSERT_TRUE(a.Admit(100, "rank 0 of job j", absl::ZeroDuration(), Welcomed).ok());
  std::thread closer([&] {
    absl::SleepFor(absl::Milliseconds(50));
    a.Close();
  });
  const absl::Time start = absl::Now();
  const absl::Status s = a.Admit(200, "rank 0 of job j", absl::Seconds(10), Welcomed);
  closer.join();
  EXPECT_EQ(s, absl::UnavailableError("no job is assigned to this worker yet"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

}  // namespace
}  // namespace ringmaster
