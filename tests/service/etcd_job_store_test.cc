// The etcd JobStore against a real etcd (Debian's etcd-server, installed by
// scripts/install-deps.sh) started on loopback by the test, with its own data directory; skipped
// where etcd is not installed. Its fenced writes are tested with the leader election
// (leader_election_test.cc).
#include "coordinator/etcd_job_store.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "coordinator/etcd_client.h"
#include "coordinator/job_registry.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/etcd_server.h"

namespace ringmaster {
namespace {

class EtcdJobStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!EtcdServer::Installed()) {
      GTEST_SKIP() << EtcdServer::kBinary << " is not installed (etcd-server)";
    }
    etcd_ = std::make_unique<EtcdServer>("etcd_job_store_test", [](const std::string& url) {
      return OpenEtcdJobStore(url, "/test", absl::Milliseconds(200)).ok();
    });
    ASSERT_TRUE(etcd_->ready()) << "etcd did not start on " << etcd_->url();
    url_ = etcd_->url();
  }

  static Job Running() {
    Job job;
    job.id = "job-000007";
    job.spec.name = "train";
    job.spec.np = 2;
    job.spec.command = {"python3", "train.py"};
    job.state = JobState::kRunning;
    job.epoch = 3;
    for (int r = 0; r < 2; ++r) {
      RankInfo info;
      info.rank = r;
      info.worker_id = absl::StrCat("worker-00000", r + 1);
      info.host = absl::StrCat("h", r);
      info.device = "cpu";
      info.state = RankState::kStarted;
      job.ranks.push_back(info);
    }
    return job;
  }

  std::unique_ptr<EtcdServer> etcd_;
  std::string url_;
};

TEST_F(EtcdJobStoreTest, JobsAreKeptInEtcdAndSurviveTheStore) {
  {
    absl::StatusOr<std::unique_ptr<JobStore>> store = OpenEtcdJobStore(url_, "/test");
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Put(Running()).ok());
    Job other = Running();
    other.id = "job-000002";
    other.state = JobState::kSucceeded;
    other.reason = "all 2 ranks exited 0";
    ASSERT_TRUE((*store)->Put(other).ok());
  }
  absl::StatusOr<std::unique_ptr<JobStore>> store = OpenEtcdJobStore(url_, "/test");
  ASSERT_TRUE(store.ok()) << store.status();
  absl::StatusOr<Job> job = (*store)->Get("job-000007");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state, JobState::kRunning);
  EXPECT_EQ(job->epoch, 3);
  ASSERT_EQ(job->ranks.size(), 2u);
  EXPECT_EQ(job->ranks[1].worker_id, "worker-000002");
  EXPECT_EQ(job->ranks[1].host, "h1");
  EXPECT_EQ((*store)->Get("job-000009").status().code(), absl::StatusCode::kNotFound);
  std::vector<std::string> ids;
  for (const Job& j : (*store)->List()) ids.push_back(j.id);
  EXPECT_THAT(ids, ::testing::ElementsAre("job-000002", "job-000007"));  // oldest first
  // Another prefix is another coordinator's: it sees none of these.
  absl::StatusOr<std::unique_ptr<JobStore>> elsewhere = OpenEtcdJobStore(url_, "/other");
  ASSERT_TRUE(elsewhere.ok());
  EXPECT_TRUE((*elsewhere)->List().empty());
  // A registry over it numbers on after the highest id.
  FakeClock clock;
  JobRegistry registry(*std::move(store), &clock);
  JobSpec spec;
  spec.name = "next";
  spec.np = 1;
  spec.command = {"true"};
  absl::StatusOr<Job> next = registry.Register(spec);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->id, "job-000008");
}

TEST_F(EtcdJobStoreTest, AnUnreachableEndpointIsPassedForTheNextOne) {
  // Port 1 refuses at once: the store goes on to the live member.
  const std::string both = absl::StrCat("etcd://127.0.0.1:1,", url_.substr(7));
  absl::StatusOr<std::unique_ptr<JobStore>> store = OpenEtcdJobStore(both, "/test");
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Put(Running()).ok());
  EXPECT_TRUE((*store)->Get("job-000007").ok());
}

TEST_F(EtcdJobStoreTest, NoEtcdIsUnavailableNamingTheUrlAndBadUrlsAreRefused) {
  absl::StatusOr<std::unique_ptr<JobStore>> none =
      OpenEtcdJobStore("etcd://127.0.0.1:1", "/test", absl::Milliseconds(500));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(none.status().message()),
              ::testing::StartsWith("--store etcd://127.0.0.1:1: etcd does not answer ("));
  for (const char* bad :
       {"http://127.0.0.1:2379", "etcd://", "etcd://host", "etcd://h:0", "etcd://h:2379,nope"}) {
    absl::StatusOr<std::vector<std::string>> e = ParseEtcdUrl(bad);
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_THAT(*ParseEtcdUrl("etcd://a:1,b.example:2379"),
              ::testing::ElementsAre("a:1", "b.example:2379"));
}

}  // namespace
}  // namespace ringmaster
