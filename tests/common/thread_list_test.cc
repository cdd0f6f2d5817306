#include "common/thread_list.h"

#include <atomic>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace ringmaster {
namespace {

TEST(ThreadListTest, JoinAllWaitsForEveryTaskAndThoseTheyStart) {
  ThreadList threads;
  std::atomic<int> done{0};
  absl::Notification second_started;
  // The first task starts the second only after JoinAll has taken the list (a job's stop that
  // starts its cleanup while the daemon shuts down): JoinAll still waits for it.
  threads.Start([&] {
    absl::SleepFor(absl::Milliseconds(50));
    threads.Start([&] {
      absl::SleepFor(absl::Milliseconds(100));
      done.fetch_add(1);
    });
    second_started.Notify();
    done.fetch_add(1);
  });
  threads.JoinAll();
  EXPECT_TRUE(second_started.HasBeenNotified());
  EXPECT_EQ(done.load(), 2);
}

}  // namespace
}  // namespace ringmaster
