#include "coordinator/worker_registry.h"

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::SizeIs;

std::vector<std::string> Ids(const std::vector<Worker>& workers) {
  std::vector<std::string> ids;
  for (const Worker& w : workers) ids.push_back(w.id);
  return ids;
}

class WorkerRegistryTest : public ::testing::Test {
 protected:
  // Registers and connects a worker; returns its id.
  std::string AddConnected(const std::string& host, const std::string& device = "cpu") {
    absl::StatusOr<Worker> w = registry_.Register(host, device, {});
    EXPECT_TRUE(w.ok()) << w.status();
    EXPECT_TRUE(registry_.SetConnected(w->id, true).ok());
    return w->id;
  }

  FakeClock clock_;
  WorkerRegistry registry_{&clock_, absl::Seconds(10)};
};

TEST_F(WorkerRegistryTest, RegisterAssignsSequentialIdsAndStartsIdleAndDisconnected) {
  EXPECT_EQ(registry_.lease(), absl::Seconds(10));
  absl::StatusOr<Worker> a = registry_.Register("host-a", "cuda:3", {{"zone", "eu"}});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->id, "worker-000001");
  EXPECT_EQ(a->host, "host-a");
  EXPECT_EQ(a->device, "cuda:3");
  EXPECT_EQ(a->labels, (std::map<std::string, std::string>{{"zone", "eu"}}));
  EXPECT_EQ(a->state, WorkerState::kIdle);
  EXPECT_FALSE(a->connected);
  EXPECT_EQ(a->last_heartbeat, clock_.Now());
  EXPECT_EQ(a->job_id, "");
  EXPECT_EQ(a->rank, -1);

  absl::StatusOr<Worker> b = registry_.Register("host-b", "cpu", {});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->id, "worker-000002");
  EXPECT_THAT(Ids(registry_.List()), ElementsAre("worker-000001", "worker-000002"));
}

struct PlacementCase {
  std::string host;
  std::string device;
  std::string message;
};

class PlacementValidationTest : public WorkerRegistryTest,
                                public ::testing::WithParamInterface<PlacementCase> {};

TEST_P(PlacementValidationTest, BadPlacementIsRejectedAndLeavesTheRegistryUnchanged) {
  absl::StatusOr<Worker> w = registry_.Register(GetParam().host, GetParam().device, {});
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w.status().message(), GetParam().message);
  EXPECT_THAT(registry_.List(), IsEmpty());
  // No id was used up.
  absl::StatusOr<Worker> ok = registry_.Register("host-a", "cpu", {});
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->id, "worker-000001");
}

INSTANTIATE_TEST_SUITE_P(
    WorkerRegistry, PlacementValidationTest,
    ::testing::Values(
        PlacementCase{"", "cpu", "host must be 1..253 bytes; got 0"},
        PlacementCase{std::string(254, 'h'), "cpu", "host must be 1..253 bytes; got 254"},
        PlacementCase{"host a", "cpu",
                      "host 'host a' may contain only letters, digits, '.', '-' and '_'"},
        PlacementCase{"host-a", "gpu0",
                      "device 'gpu0' is not \"cpu\" or \"cuda:N\" (0 <= N < 1024)"},
        PlacementCase{"host-a", "cuda:1024",
                      "device 'cuda:1024' is not \"cpu\" or \"cuda:N\" (0 <= N < 1024)"},
        PlacementCase{"host-a", "cuda:-1",
                      "device 'cuda:-1' is not \"cpu\" or \"cuda:N\" (0 <= N < 1024)"},
        PlacementCase{"host-a",
                      "cuda:", "device 'cuda:' is not \"cpu\" or \"cuda:N\" (0 <= N < 1024)"},
        PlacementCase{"host-a", "", "device '' is not \"cpu\" or \"cuda:N\" (0 <= N < 1024)"}));

TEST_F(WorkerRegistryTest, AcceptsTheEdgesOfValidPlacements) {
  EXPECT_TRUE(ValidateWorkerPlacement(std::string(253, 'h'), "cuda:1023").ok());
  EXPECT_TRUE(ValidateWorkerPlacement("gpu-node_7.example.com", "cuda:0").ok());
  EXPECT_TRUE(ValidateWorkerPlacement("h", "cpu").ok());
}

TEST_F(WorkerRegistryTest, TooManyLabelsAreRejected) {
  std::map<std::string, std::string> labels;
  for (int i = 0; i < 65; ++i) labels[absl::StrCat("k", i)] = "v";
  absl::StatusOr<Worker> w = registry_.Register("host-a", "cpu", labels);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w.status().message(), "labels has more than 64 entries");
  EXPECT_THAT(registry_.List(), IsEmpty());
  labels.erase("k0");
  EXPECT_TRUE(registry_.Register("host-a", "cpu", labels).ok());
}

TEST_F(WorkerRegistryTest, TheDataPlaneAddressIsKeptAndMustBeNumeric) {
  absl::StatusOr<Worker> v4 = registry_.Register("host-a", "cpu", {}, 0, "10.77.0.3");
  ASSERT_TRUE(v4.ok()) << v4.status();
  EXPECT_EQ(v4->address, "10.77.0.3");
  absl::StatusOr<Worker> v6 = registry_.Register("host-b", "cpu", {}, 0, "fd00::7");
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(registry_.Get(v6->id)->address, "fd00::7");
  absl::StatusOr<Worker> none = registry_.Register("host-c", "cpu", {});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->address, "");
  for (const std::string bad : {"node-3", "10.77.0.3:4000", "10.77.0.300", " 10.0.0.1"}) {
    absl::StatusOr<Worker> w = registry_.Register("host-d", "cpu", {}, 0, bad);
    EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(w.status().message(),
              absl::StrCat("address '", bad, "' is not a numeric IPv4 or IPv6 address"));
  }
  // A NUL would end the text inet_pton reads: refused, not cut short.
  absl::StatusOr<Worker> nul =
      registry_.Register("host-d", "cpu", {}, 0, std::string("10.0.0.1\0junk", 13));
  EXPECT_EQ(nul.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_.List().size(), 3u);
}

TEST_F(WorkerRegistryTest, LabelsAreBoundedAndNothingIsRegisteredPastTheBounds) {
  absl::StatusOr<Worker> w =
      registry_.Register("h", "cpu", {{"zone", std::string(10 << 20, 'x')}});  // a 10 MB label
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w.status().message(), "labels['zone'] must be at most 256 bytes; got 10485760");
  w = registry_.Register("h", "cpu", {{std::string(64, 'k'), "v"}});
  EXPECT_EQ(w.status().message(),
            absl::StrCat("labels key '", std::string(64, 'k'), "' must be 1..63 bytes; got 64"));
  w = registry_.Register("h", "cpu", {{"", "v"}});
  EXPECT_EQ(w.status().message(), "labels key '' must be 1..63 bytes; got 0");
  EXPECT_TRUE(registry_.List().empty());
  EXPECT_TRUE(registry_.Register("h", "cpu", {{std::string(63, 'k'), std::string(256, 'v')}}).ok());
}

TEST_F(WorkerRegistryTest, ASessionProofIsTheRegisteringIdentityAndItsIssuedSecret) {
  absl::StatusOr<Worker> w = registry_.Register("host-a", "cpu", {}, 0, "", "host-a-cert");
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ(w->secret.size(), 64u);
  EXPECT_EQ(w->secret_sha256.size(), 64u);
  EXPECT_NE(w->secret, w->secret_sha256);
  EXPECT_TRUE(registry_.Get(w->id)->secret.empty());  // only the registration's reply has it
  EXPECT_TRUE(registry_.CheckSessionProof(w->id, "host-a-cert", w->secret).ok());
  absl::Status s = registry_.CheckSessionProof(w->id, "host-a-cert", std::string(64, 'f'));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(s.message(),
            "the session secret for worker_id 'worker-000001' is not the one its "
            "registration issued: register again");
  s = registry_.CheckSessionProof(w->id, "host-b-cert", w->secret);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(s.message(),
            "worker_id 'worker-000001' was registered by 'host-a-cert'; "
            "'host-b-cert' may not open its session");
  s = registry_.CheckSessionProof(w->id, "", w->secret);
  EXPECT_EQ(s.message(),
            "worker_id 'worker-000001' was registered by 'host-a-cert'; a caller "
            "without one may not open its session");
  EXPECT_EQ(registry_.CheckSessionProof("worker-000009", "host-a-cert", w->secret).code(),
            absl::StatusCode::kNotFound);
  // Two registrations never share a secret.
  absl::StatusOr<Worker> w2 = registry_.Register("host-a", "cuda:0", {}, 0, "", "host-a-cert");
  EXPECT_NE(w2->secret, w->secret);
}

TEST_F(WorkerRegistryTest, TheSameIdentityHostAndSlotRegisteringAgainReplacesTheOldWorker) {
  const std::string slot = "/run/ringmaster/cpu0.sock";
  absl::StatusOr<Worker> old_worker = registry_.Register("host-a", "cpu", {}, 0, "", "id-a", slot);
  // Another slot of the host (a second CPU daemon), another identity, another host, no slot, no
  // identity: none of them is the same daemon.
  absl::StatusOr<Worker> other_slot =
      registry_.Register("host-a", "cpu", {}, 0, "", "id-a", "/run/ringmaster/cpu1.sock");
  absl::StatusOr<Worker> other_identity =
      registry_.Register("host-a", "cpu", {}, 0, "", "id-b", slot);
  absl::StatusOr<Worker> other_host = registry_.Register("host-b", "cpu", {}, 0, "", "id-a", slot);
  absl::StatusOr<Worker> no_slot = registry_.Register("host-a", "cpu", {}, 0, "", "id-a");
  absl::StatusOr<Worker> anonymous = registry_.Register("host-a", "cpu", {}, 0, "", "", slot);
  EXPECT_TRUE(registry_.ExpireLeases().empty());
  absl::StatusOr<Worker> again = registry_.Register("host-a", "cpu", {}, 0, "", "id-a", slot);
  std::vector<Worker> lost = registry_.ExpireLeases();
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].id, old_worker->id);
  EXPECT_EQ(lost[0].lost_reason,
            absl::StrCat("its identity 'id-a' registered host-a /run/ringmaster/cpu0.sock again, "
                         "as ",
                         again->id, " (its daemon restarted or registered anew)"));
  // Its row is gone: a daemon that registers again leaves no stale LOST row behind.
  EXPECT_EQ(registry_.Get(old_worker->id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry_.List().size(), 6u);
  for (const auto* w : {&other_slot, &other_identity, &other_host, &no_slot, &anonymous}) {
    EXPECT_TRUE(registry_.Get((*w)->id).ok()) << (*w)->id;
  }
  EXPECT_EQ(
      registry_.Register("h", "cpu", {}, 0, "", "id", std::string(257, 's')).status().message(),
      "slot must be at most 256 bytes; got 257");
}

TEST_F(WorkerRegistryTest, WithoutAuthenticationTheSameHostAndSlotRegisteringAgainReplacesIt) {
  // A daemon that lost its lease (or restarted) registers again from the same socket: one row.
  const std::string slot = "/tmp/ringmaster-7-0.sock";
  absl::StatusOr<Worker> first = registry_.Register("local-0", "cpu", {}, 0, "", "", slot);
  ASSERT_TRUE(registry_.SetConnected(first->id, true).ok());
  // While its session is open, a claim on its slot does not knock it out.
  absl::StatusOr<Worker> claim = registry_.Register("local-0", "cpu", {}, 0, "", "", slot);
  EXPECT_TRUE(registry_.ExpireLeases().empty());
  ASSERT_TRUE(registry_.SetConnected(first->id, false).ok());
  absl::StatusOr<Worker> again = registry_.Register("local-0", "cpu", {}, 0, "", "", slot);
  std::vector<Worker> lost = registry_.ExpireLeases();
  // The claim (never connected) and the first worker both gave way to the last registration.
  ASSERT_EQ(lost.size(), 2u);
  EXPECT_EQ(lost[0].id, first->id);
  EXPECT_EQ(lost[0].lost_reason,
            absl::StrCat("registered local-0 /tmp/ringmaster-7-0.sock again, as ", again->id,
                         " (its daemon restarted or registered anew)"));
  EXPECT_EQ(lost[1].id, claim->id);
  ASSERT_EQ(registry_.List().size(), 1u);
  EXPECT_EQ(registry_.List()[0].id, again->id);
}

TEST_F(WorkerRegistryTest, RenewingLeasesAfterTheCoordinatorsOwnPauseBlamesNoWorker) {
  const std::string idle = AddConnected("host-a");
  const std::string busy = AddConnected("host-b");
  ASSERT_TRUE(registry_.Assign({busy}, "job-000001", {0}).ok());
  const std::string broken = AddConnected("host-c");
  ASSERT_TRUE(registry_.Assign({broken}, "job-000002", {0}).ok());
  ASSERT_TRUE(registry_.SetConnected(broken, false).ok());
  // The coordinator did not run for 30 s: no heartbeat was read meanwhile.
  clock_.Advance(absl::Seconds(30));
  registry_.RenewLeases();
  EXPECT_TRUE(registry_.ExpireLeases().empty());
  // The terms start again from now: a silent worker is lost a full lease later, a broken session
  // after its reconnect grace (2 s).
  clock_.Advance(absl::Seconds(2));
  std::vector<Worker> lost = registry_.ExpireLeases();
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].id, broken);
  clock_.Advance(absl::Seconds(8));
  lost = registry_.ExpireLeases();
  ASSERT_EQ(lost.size(), 2u);
  EXPECT_EQ(lost[0].id, idle);
  EXPECT_EQ(lost[0].lost_reason, "no heartbeat for 10s");
  EXPECT_EQ(lost[1].id, busy);
}

TEST_F(WorkerRegistryTest, UnknownWorkerIsNotFound) {
  EXPECT_EQ(registry_.Get("worker-000042").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry_.Get("worker-000042").status().message(),
            "worker_id 'worker-000042' is not registered");
  EXPECT_EQ(registry_.Heartbeat("worker-000042").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry_.SetConnected("worker-000042", true).code(), absl::StatusCode::kNotFound);
}

TEST_F(WorkerRegistryTest, LeaseExpiresExactlyAtTheLeaseWithoutAHeartbeat) {
  const std::string a = AddConnected("host-a");
  const std::string b = AddConnected("host-b");
  clock_.Advance(absl::Seconds(4));
  ASSERT_TRUE(registry_.Heartbeat(b).ok());

  clock_.Advance(absl::Seconds(6) - absl::Nanoseconds(1));  // a: 10 s - 1 ns
  EXPECT_THAT(registry_.ExpireLeases(), IsEmpty());

  clock_.Advance(absl::Nanoseconds(1));  // a: exactly 10 s; b: 6 s
  std::vector<Worker> lost = registry_.ExpireLeases();
  ASSERT_THAT(lost, SizeIs(1));
  EXPECT_EQ(lost[0].id, a);
  EXPECT_EQ(lost[0].host, "host-a");
  EXPECT_EQ(lost[0].state, WorkerState::kIdle);  // as it was

  absl::StatusOr<Worker> got = registry_.Get(a);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(got.status().message(),
            "worker worker-000001 on host-a lost its lease; register again");
  absl::Status heartbeat = registry_.Heartbeat(a);
  EXPECT_EQ(heartbeat.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(heartbeat.message(), "worker worker-000001 on host-a lost its lease; register again");

  std::vector<Worker> all = registry_.List();
  ASSERT_THAT(all, SizeIs(2));
  EXPECT_EQ(all[0].state, WorkerState::kLost);
  EXPECT_FALSE(all[0].connected);
  EXPECT_EQ(all[1].state, WorkerState::kIdle);
  EXPECT_THAT(Ids(registry_.Available()), ElementsAre(b));

  // A lost worker is reported once; b keeps its lease while it heartbeats.
  clock_.Advance(absl::Seconds(3));
  ASSERT_TRUE(registry_.Heartbeat(b).ok());
  clock_.Advance(absl::Seconds(9));
  EXPECT_THAT(registry_.ExpireLeases(), IsEmpty());
}

TEST_F(WorkerRegistryTest, ExpiredBusyWorkerIsReturnedWithItsJob) {
  const std::string a = AddConnected("host-a");
  ASSERT_TRUE(registry_.Assign({a}, "job-000007", {3}).ok());
  clock_.Advance(absl::Seconds(10));
  std::vector<Worker> lost = registry_.ExpireLeases();
  ASSERT_THAT(lost, SizeIs(1));
  EXPECT_EQ(lost[0].state, WorkerState::kBusy);
  EXPECT_EQ(lost[0].job_id, "job-000007");
  EXPECT_EQ(lost[0].rank, 3);
  // Releasing a lost worker changes nothing.
  registry_.Release(a);
  EXPECT_EQ(registry_.List()[0].state, WorkerState::kLost);
}

TEST_F(WorkerRegistryTest, ConnectingRenewsTheLease) {
  absl::StatusOr<Worker> w = registry_.Register("host-a", "cpu", {});
  ASSERT_TRUE(w.ok());
  clock_.Advance(absl::Seconds(9));
  ASSERT_TRUE(registry_.SetConnected(w->id, true).ok());
  clock_.Advance(absl::Seconds(9));
  EXPECT_THAT(registry_.ExpireLeases(), IsEmpty());
  EXPECT_EQ(registry_.Get(w->id)->last_heartbeat, clock_.Now() - absl::Seconds(9));
}

TEST_F(WorkerRegistryTest, AvailableMeansIdleAndConnected) {
  absl::StatusOr<Worker> disconnected = registry_.Register("host-a", "cpu", {});
  ASSERT_TRUE(disconnected.ok());
  const std::string idle = AddConnected("host-b");
  const std::string busy = AddConnected("host-c");
  ASSERT_TRUE(registry_.Assign({busy}, "job-000001", {0}).ok());
  EXPECT_THAT(Ids(registry_.Available()), ElementsAre(idle));

  ASSERT_TRUE(registry_.SetConnected(idle, false).ok());
  EXPECT_THAT(registry_.Available(), IsEmpty());
}

TEST_F(WorkerRegistryTest, AssignIsAllOrNothing) {
  const std::string a = AddConnected("host-a");
  absl::StatusOr<Worker> b = registry_.Register("host-b", "cpu", {});  // not connected
  ASSERT_TRUE(b.ok());
  const std::string c = AddConnected("host-c");

  absl::Status s = registry_.Assign({a, b->id, c}, "job-000001", {0, 1, 2});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "worker worker-000002 is not idle");
  for (const Worker& w : registry_.List()) {
    EXPECT_EQ(w.state, WorkerState::kIdle) << w.id;
    EXPECT_EQ(w.job_id, "") << w.id;
    EXPECT_EQ(w.rank, -1) << w.id;
  }

  EXPECT_EQ(registry_.Assign({a, "worker-000099"}, "job-000001", {0, 1}).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(registry_.Get(a)->state, WorkerState::kIdle);

  ASSERT_TRUE(registry_.Assign({c, a}, "job-000001", {0, 1}).ok());
  EXPECT_EQ(registry_.Get(c)->rank, 0);
  EXPECT_EQ(registry_.Get(a)->rank, 1);
  EXPECT_EQ(registry_.Get(a)->state, WorkerState::kBusy);
  EXPECT_EQ(registry_.Get(a)->job_id, "job-000001");

  // Busy workers cannot be taken by another job.
  s = registry_.Assign({a}, "job-000002", {0});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "worker worker-000001 is not idle");
  EXPECT_EQ(registry_.Get(a)->job_id, "job-000001");
}

TEST_F(WorkerRegistryTest, ReleaseReturnsABusyWorkerToIdle) {
  const std::string a = AddConnected("host-a");
  ASSERT_TRUE(registry_.Assign({a}, "job-000001", {0}).ok());
  registry_.Release(a);
  absl::StatusOr<Worker> w = registry_.Get(a);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->state, WorkerState::kIdle);
  EXPECT_EQ(w->job_id, "");
  EXPECT_EQ(w->rank, -1);
  registry_.Release("worker-000099");  // unknown: no-op
  EXPECT_THAT(registry_.List(), SizeIs(1));
}

TEST(WorkerStateNameTest, Names) {
  EXPECT_EQ(WorkerStateName(WorkerState::kIdle), "IDLE");
  EXPECT_EQ(WorkerStateName(WorkerState::kBusy), "BUSY");
  EXPECT_EQ(WorkerStateName(WorkerState::kLost), "LOST");
}

}  // namespace
}  // namespace ringmaster
