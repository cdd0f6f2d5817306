// Coordinator replicas electing a leader on a real etcd (started on loopback by the test; skipped
// where etcd is not installed): one leads and the others name it; a resignation hands over at
// once; a dead leader's lease runs out and a follower takes over within the TTL; a replica
// restarted at its own address takes its key back at once; the old leader's fenced store writes
// are refused after a takeover, and a leader whose key goes says it lost the leadership.
#include "coordinator/leader_election.h"

#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "coordinator/etcd_client.h"
#include "coordinator/etcd_job_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/etcd_server.h"

namespace ringmaster {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kTtl = absl::Seconds(2);  // etcd's smallest lease with its defaults

class LeaderElectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!EtcdServer::Installed()) {
      GTEST_SKIP() << EtcdServer::kBinary << " is not installed (etcd-server)";
    }
    etcd_ = std::make_unique<EtcdServer>("leader_election_test", [](const std::string& url) {
      return OpenEtcdJobStore(url, "/test", absl::Milliseconds(200)).ok();
    });
    ASSERT_TRUE(etcd_->ready()) << "etcd did not start on " << etcd_->url();
  }

  std::unique_ptr<EtcdClient> Client() const {
    return std::make_unique<EtcdClient>(std::vector<std::string>{etcd_->endpoint()},
                                        absl::Seconds(2));
  }

  std::unique_ptr<LeaderElection> Replica(const std::string& identity) const {
    auto e = std::make_unique<LeaderElection>(
        Client(), LeaderElectionOptions{.prefix = "/test", .identity = identity, .ttl = kTtl});
    e->Start();
    return e;
  }

  // Waits (bounded) until `e` leads; how long that took.
  static absl::Duration AwaitLeading(LeaderElection& e, absl::Duration limit) {
    const absl::Time start = absl::Now();
    EXPECT_TRUE(e.AwaitLeadership([&] { return absl::Now() - start > limit; }).ok())
        << "no leadership within " << limit;
    return absl::Now() - start;
  }

  static bool Eventually(const std::function<bool()>& what, absl::Duration limit) {
    for (const absl::Time end = absl::Now() + limit; absl::Now() < end;) {
      if (what()) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return what();
  }

  std::unique_ptr<EtcdServer> etcd_;
};

TEST_F(LeaderElectionTest, OneReplicaLeadsAndTheOtherFollowsNamingIt) {
  std::unique_ptr<LeaderElection> a = Replica("10.0.0.1:50051");
  AwaitLeading(*a, absl::Seconds(5));
  EXPECT_EQ(a->leader(), "10.0.0.1:50051");
  EXPECT_GT(a->revision(), 0);
  EXPECT_EQ(a->key(), "/test/leader");
  std::unique_ptr<LeaderElection> b = Replica("10.0.0.2:50051");
  ASSERT_TRUE(Eventually([&] { return b->leader() == "10.0.0.1:50051"; }, absl::Seconds(5)));
  EXPECT_FALSE(b->leading());
  // Still so a few rounds later: the leader keeps its lease.
  absl::SleepFor(kTtl * 2);
  EXPECT_TRUE(a->leading());
  EXPECT_FALSE(b->leading());
  EXPECT_EQ(a->lost(), "");
}

TEST_F(LeaderElectionTest, AResignationHandsOverAtOnce) {
  std::unique_ptr<LeaderElection> a = Replica("10.0.0.1:50051");
  AwaitLeading(*a, absl::Seconds(5));
  std::unique_ptr<LeaderElection> b = Replica("10.0.0.2:50051");
  ASSERT_TRUE(Eventually([&] { return b->leader() == "10.0.0.1:50051"; }, absl::Seconds(5)));
  a->Resign();
  EXPECT_LT(AwaitLeading(*b, absl::Seconds(5)), absl::Seconds(1));  // not the TTL
  EXPECT_EQ(b->leader(), "10.0.0.2:50051");
}

TEST_F(LeaderElectionTest, ADeadLeadersLeaseRunsOutAndAFollowerTakesOverWithinTheTtl) {
  std::unique_ptr<LeaderElection> a = Replica("10.0.0.1:50051");
  AwaitLeading(*a, absl::Seconds(5));
  std::unique_ptr<LeaderElection> b = Replica("10.0.0.2:50051");
  ASSERT_TRUE(Eventually([&] { return b->leader() == "10.0.0.1:50051"; }, absl::Seconds(5)));
  a.reset();  // as a crash: its lease is neither kept nor revoked
  const absl::Duration took = AwaitLeading(*b, absl::Seconds(10));
  // Not before the lease could have run out, and within the TTL plus a campaign round or so.
  EXPECT_GT(took, kTtl / 2);
  EXPECT_LT(took, kTtl + absl::Seconds(2));
  EXPECT_EQ(b->leader(), "10.0.0.2:50051");
}

TEST_F(LeaderElectionTest, AReplicaRestartedAtItsOwnAddressTakesItsKeyBackAtOnce) {
  std::unique_ptr<LeaderElection> a = Replica("10.0.0.1:50051");
  AwaitLeading(*a, absl::Seconds(5));
  const int64_t first = a->revision();
  a.reset();  // killed
  std::unique_ptr<LeaderElection> again = Replica("10.0.0.1:50051");
  EXPECT_LT(AwaitLeading(*again, absl::Seconds(5)), absl::Seconds(1));
  EXPECT_GT(again->revision(), first);
}

TEST_F(LeaderElectionTest, TheOldLeadersFencedWritesAreRefusedOnceAnotherLeads) {
  std::unique_ptr<LeaderElection> a = Replica("10.0.0.1:50051");
  AwaitLeading(*a, absl::Seconds(5));
  absl::StatusOr<std::unique_ptr<JobStore>> old_store =
      OpenEtcdJobStore(etcd_->url(), "/test", absl::Seconds(2), EtcdFence{a->key(), a->revision()});
  ASSERT_TRUE(old_store.ok()) << old_store.status();
  Job job;
  job.id = "job-000001";
  job.spec.name = "train";
  job.spec.np = 1;
  job.spec.command = {"true"};
  ASSERT_TRUE((*old_store)->Put(job).ok());

  std::unique_ptr<LeaderElection> b = Replica("10.0.0.2:50051");
  a->Resign();
  AwaitLeading(*b, absl::Seconds(5));
  job.reason = "written by a replica that no longer leads";
  const absl::Status refused = (*old_store)->Put(job);
  EXPECT_EQ(refused.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr("writing job job-000001: this coordinator no longer leads: etcd's "
                        "/test/leader is not the one it created"));
  EXPECT_EQ((*old_store)->Delete("job-000001").code(), absl::StatusCode::kAborted);

  absl::StatusOr<std::unique_ptr<JobStore>> new_store =
      OpenEtcdJobStore(etcd_->url(), "/test", absl::Seconds(2), EtcdFence{b->key(), b->revision()});
  ASSERT_TRUE(new_store.ok());
  absl::StatusOr<Job> kept = (*new_store)->Get("job-000001");
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->reason, "");  // the refused write changed nothing
  job.reason = "written by the leader";
  EXPECT_TRUE((*new_store)->Put(job).ok());
}

TEST_F(LeaderElectionTest, ALeaderWhoseKeyIsDeletedSaysItLostTheLeadership) {
  std::unique_ptr<LeaderElection> a = Replica("10.0.0.1:50051");
  AwaitLeading(*a, absl::Seconds(5));
  etcdserverpb::DeleteRangeRequest del;
  del.set_key("/test/leader");
  etcdserverpb::DeleteRangeResponse out;
  ASSERT_TRUE(Client()->DeleteRange(del, &out).ok());
  ASSERT_TRUE(Eventually([&] { return !a->lost().empty(); }, kTtl * 2));
  EXPECT_EQ(a->lost(), "/test/leader was deleted");
  EXPECT_FALSE(a->leading());
}

}  // namespace
}  // namespace ringmaster
