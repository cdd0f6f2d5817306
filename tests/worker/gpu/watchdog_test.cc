// The NCCL watchdog's state machine against a fake communicator: what aborts, that the abort
// happens exactly once and the communicator is never queried after it, and what the engine is told.
#include "worker/gpu/watchdog.h"

#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster {
namespace {

class FakeCommunicator : public WatchedCommunicator {
 public:
  absl::Status AsyncError() override {
    EXPECT_EQ(aborts, 0) << "queried after the abort";
    ++queries;
    return error;
  }
  void Abort() override { ++aborts; }

  absl::Status error;
  int queries = 0;
  int aborts = 0;
};

const absl::Time kT0 = absl::FromUnixSeconds(1000);
constexpr char kWhere[] = "rank 3 (host-b, cuda:1)";

TEST(WatchdogTest, HealthyCommunicatorIsPolledAndLeftAlone) {
  FakeCommunicator comm;
  Watchdog w(&comm, kWhere, absl::Seconds(30));
  ASSERT_TRUE(w.OpStarted("allreduce", kT0).ok());
  EXPECT_FALSE(w.Check(kT0 + absl::Seconds(29)).has_value());
  w.OpFinished();
  // No collective in flight: no deadline, however long.
  EXPECT_FALSE(w.Check(kT0 + absl::Hours(5)).has_value());
  EXPECT_EQ(w.state(), Watchdog::State::kHealthy);
  EXPECT_EQ(comm.queries, 2);
  EXPECT_EQ(comm.aborts, 0);
}

TEST(WatchdogTest, AnAsyncErrorAbortsOnceAndFailsEverythingAfter) {
  FakeCommunicator comm;
  std::vector<absl::Status> reported;
  Watchdog w(&comm, kWhere, absl::Seconds(30),
             [&](const absl::Status& s) { reported.push_back(s); });
  ASSERT_TRUE(w.OpStarted("allreduce", kT0).ok());
  comm.error = absl::UnavailableError("a remote peer failed (ncclRemoteError)");
  std::optional<absl::Status> failed = w.Check(kT0 + absl::Seconds(1));
  ASSERT_TRUE(failed.has_value());
  EXPECT_EQ(failed->code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(failed->message(),
            "NCCL error on rank 3 (host-b, cuda:1): a remote peer failed (ncclRemoteError)");
  EXPECT_EQ(comm.aborts, 1);
  EXPECT_EQ(w.state(), Watchdog::State::kAborted);
  ASSERT_EQ(reported.size(), 1u);
  EXPECT_EQ(reported[0], *failed);
  // Later checks neither query nor abort again; new collectives are refused with the cause.
  EXPECT_FALSE(w.Check(kT0 + absl::Seconds(2)).has_value());
  w.PeerLost("job stopped");
  EXPECT_EQ(comm.aborts, 1);
  EXPECT_EQ(comm.queries, 1);
  absl::Status next = w.OpStarted("broadcast", kT0 + absl::Seconds(3));
  EXPECT_EQ(next.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(next.message(),
            "the NCCL communicator of rank 3 (host-b, cuda:1) was aborted earlier: NCCL error on "
            "rank 3 (host-b, cuda:1): a remote peer failed (ncclRemoteError)");
  EXPECT_EQ(w.failure(), *failed);
  EXPECT_EQ(reported.size(), 1u);
}

TEST(WatchdogTest, ACollectivePastItsDeadlineAborts) {
  FakeCommunicator comm;
  Watchdog w(&comm, kWhere, absl::Seconds(30));
  ASSERT_TRUE(w.OpStarted("allreduce", kT0).ok());
  EXPECT_FALSE(w.Check(kT0 + absl::Seconds(30)).has_value());  // at the deadline: not yet
  std::optional<absl::Status> failed = w.Check(kT0 + absl::Seconds(31));
  ASSERT_TRUE(failed.has_value());
  EXPECT_EQ(failed->code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(failed->message(),
            "NCCL allreduce on rank 3 (host-b, cuda:1) did not complete in 30s (a peer is stuck or "
            "gone); the communicator was aborted");
  EXPECT_EQ(comm.aborts, 1);
}

TEST(WatchdogTest, APeerLostAbortsWithTheCoordinatorsReason) {
  FakeCommunicator comm;
  int reports = 0;
  Watchdog w(&comm, kWhere, absl::Seconds(30), [&](const absl::Status&) { ++reports; });
  w.PeerLost("job job-000004 stopped: worker w-7 serving rank 1 on host host-c was lost");
  EXPECT_EQ(comm.aborts, 1);
  EXPECT_EQ(w.failure().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(w.failure().message(),
            "NCCL communicator of rank 3 (host-b, cuda:1) aborted: job job-000004 stopped: worker "
            "w-7 serving rank 1 on host host-c was lost");
  EXPECT_EQ(reports, 0);  // told by the coordinator: nothing to report back
  EXPECT_FALSE(w.Check(kT0).has_value());
  EXPECT_EQ(comm.queries, 0);
}

TEST(WatchdogTest, CallsOnTheCommunicatorStopOnceItIsAborted) {
  FakeCommunicator comm;
  Watchdog w(&comm, kWhere, absl::Seconds(30));
  int calls = 0;
  EXPECT_TRUE(w.WithCommunicator([&] { ++calls; }));
  w.PeerLost("stop");
  EXPECT_FALSE(w.WithCommunicator([&] { ++calls; }));
  EXPECT_EQ(calls, 1);
}

TEST(WatchdogTest, ConcurrentFailuresAbortExactlyOnce) {
  FakeCommunicator comm;
  comm.error = absl::InternalError("boom");
  std::atomic<int> reports{0};
  Watchdog w(&comm, kWhere, absl::Seconds(1), [&](const absl::Status&) { ++reports; });
  std::vector<std::thread> threads;
  std::atomic<int> detected{0};
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      for (int k = 0; k < 100; ++k) {
        if (i % 2 == 0) {
          if (w.Check(kT0).has_value()) ++detected;
        } else {
          w.PeerLost("stop");
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(comm.aborts, 1);
  EXPECT_LE(detected.load(), 1);
  // Reported once when a check detected the error first; not at all when a stop came first.
  EXPECT_EQ(reports.load(), detected.load());
}

}  // namespace
}  // namespace ringmaster
