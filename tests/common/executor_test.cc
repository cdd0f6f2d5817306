#include "common/executor.h"

#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster {
namespace {

using ::testing::ElementsAre;

TEST(ExecutorTest, InlineRunsEachTaskAtOnceOnTheCaller) {
  const std::thread::id caller = std::this_thread::get_id();
  std::thread::id ran;
  Executor::Inline().Post([&] { ran = std::this_thread::get_id(); });
  EXPECT_EQ(ran, caller);
}

TEST(ExecutorTest, SerialRunsTasksInOrderOnItsThreadAndShutdownRunsWhatWasPosted) {
  SerialExecutor executor;
  absl::Notification gate;
  std::vector<int> order;  // written by the executor's thread only, read after Shutdown()
  std::thread::id ran;
  executor.Post([&] {
    gate.WaitForNotificationWithTimeout(absl::Seconds(10));
    ran = std::this_thread::get_id();
  });
  for (int i = 0; i < 5; ++i) {
    executor.Post([&order, i] { order.push_back(i); });
  }
  // A task may post more; they run after what was queued before.
  executor.Post([&] { executor.Post([&order] { order.push_back(99); }); });
  gate.Notify();
  executor.Shutdown();
  EXPECT_NE(ran, std::this_thread::get_id());
  EXPECT_THAT(order, ElementsAre(0, 1, 2, 3, 4, 99));
  // After Shutdown(), a post runs at once on the caller.
  bool late = false;
  executor.Post([&] { late = true; });
  EXPECT_TRUE(late);
  executor.Shutdown();  // idempotent
}

}  // namespace
}  // namespace ringmaster
