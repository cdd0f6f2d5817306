// The child processes of `ringmaster local`: reading a line with a deadline, exec failures,
// stopping with SIGTERM then SIGKILL, whole process groups, and death with the starting thread.
// Uses /bin/sh.
#include "cli/subprocess.h"

#include <signal.h>

#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Whether `pid` is a live process (a zombie is not).
bool Alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] != 'Z';
}

bool AwaitDeath(pid_t pid, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (Alive(pid) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  return !Alive(pid);
}

std::unique_ptr<Subprocess> Sh(const std::string& script,
                               Subprocess::Stdout out = Subprocess::Stdout::kPipe) {
  auto p = Subprocess::Start({"/bin/sh", "-c", script}, out, "test-sh");
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *std::move(p) : nullptr;
}

TEST(SubprocessTest, ReadsLinesAndReportsTheExit) {
  auto p = Sh("echo 'listening on port 4242'; printf 'part'; sleep 0.1; echo ial; exit 3");
  ASSERT_NE(p, nullptr);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  EXPECT_EQ(p->ReadLine(deadline).value_or("?"), "listening on port 4242");
  EXPECT_EQ(p->ReadLine(deadline).value_or("?"), "partial");
  absl::StatusOr<std::string> eof = p->ReadLine(deadline);
  EXPECT_EQ(eof.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(eof.status().message(), "test-sh closed its stdout");
  while (!p->exited() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(Subprocess::DescribeWaitStatus(*p->Poll()), "exited with status 3");
}

TEST(SubprocessTest, ReadLineHonoursItsDeadlineAndItsStopCheck) {
  auto p = Sh("sleep 30");
  ASSERT_NE(p, nullptr);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> line = p->ReadLine(start + absl::Milliseconds(150));
  EXPECT_EQ(line.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  line = p->ReadLine(absl::Now() + absl::Seconds(30), [] { return true; });
  EXPECT_EQ(line.status().code(), absl::StatusCode::kCancelled);
  // The destructor kills and reaps it.
  const pid_t pid = p->pid();
  p.reset();
  EXPECT_FALSE(Alive(pid));
}

TEST(SubprocessTest, AProgramThatCannotRunIsAnErrorNotAnExit) {
  auto p = Subprocess::Start({"/nonexistent/ringmaster-worker"}, Subprocess::Stdout::kInherit);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(p.status().message(), HasSubstr("cannot run /nonexistent/ringmaster-worker"));
}

TEST(SubprocessTest, StopAllTerminatesThenKillsAndTakesTheWholeProcessGroup) {
  auto polite = Sh("sleep 30", Subprocess::Stdout::kInherit);
  // Ignores SIGTERM, and leaves a grandchild in its process group.
  auto stubborn = Sh("trap '' TERM; sleep 30 & echo $!; wait");
  ASSERT_NE(polite, nullptr);
  ASSERT_NE(stubborn, nullptr);
  int grandchild = 0;
  ASSERT_TRUE(absl::SimpleAtoi(stubborn->ReadLine(absl::Now() + absl::Seconds(10)).value_or(""),
                               &grandchild));
  ASSERT_TRUE(Alive(grandchild));

  const absl::Time start = absl::Now();
  std::vector<std::string> killed =
      StopAll({polite.get(), stubborn.get()}, absl::Milliseconds(300));
  EXPECT_THAT(killed, ElementsAre("test-sh"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
  EXPECT_EQ(Subprocess::DescribeWaitStatus(*polite->Poll()), "killed by signal 15 (Terminated)");
  EXPECT_EQ(Subprocess::DescribeWaitStatus(*stubborn->Poll()), "killed by signal 9 (Killed)");
  EXPECT_TRUE(AwaitDeath(grandchild, absl::Seconds(5)));
}

TEST(SubprocessTest, StopAllReturnsAtOnceWhenEveryoneStops) {
  auto a = Sh("sleep 30", Subprocess::Stdout::kInherit);
  ASSERT_NE(a, nullptr);
  const absl::Time start = absl::Now();
  EXPECT_THAT(StopAll({a.get()}, absl::Seconds(20)), IsEmpty());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(SubprocessTest, TheChildDiesWithTheThreadThatStartedIt) {
  // PR_SET_PDEATHSIG follows the starting thread: when it ends, the kernel kills the child, as it
  // does when `ringmaster local` is killed with SIGKILL.
  std::unique_ptr<Subprocess> child;
  std::thread starter([&] { child = Sh("sleep 30", Subprocess::Stdout::kInherit); });
  starter.join();
  ASSERT_NE(child, nullptr);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!child->exited() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_TRUE(child->exited());
  EXPECT_EQ(Subprocess::DescribeWaitStatus(*child->Poll()), "killed by signal 9 (Killed)");
}

}  // namespace
}  // namespace ringmaster::cli
