// The durable job store on a real SQLite file: every field of a job comes back as stored, after the
// store is closed and opened again too; the database is in WAL mode; the registry over it goes on
// numbering after the highest id and fails the jobs that were running.
#include "coordinator/sqlite_job_store.h"

#include <sqlite3.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "common/clock.h"
#include "coordinator/job_registry.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster {
namespace {

class SqliteJobStoreTest : public ::testing::Test {
 protected:
  SqliteJobStoreTest()
      : dir_(std::filesystem::temp_directory_path() /
             ("sqlite_job_store_test-" + std::to_string(::getpid()))) {}
  ~SqliteJobStoreTest() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<JobStore> Open() {
    absl::StatusOr<std::unique_ptr<JobStore>> store = OpenSqliteJobStore(dir_.string());
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }

  static Job Running() {
    Job job;
    job.id = "job-000007";
    job.spec.name = "train";
    job.spec.np = 2;
    job.spec.command = {"python3", "train.py"};
    job.spec.env = {{"SEED", "42"}};
    job.spec.working_dir = "/work";
    job.state = JobState::kRunning;
    job.reason = "all 2 ranks started";
    job.epoch = 3;
    job.create_time = absl::FromUnixMillis(1'700'000'000'000);
    job.update_time = absl::FromUnixMillis(1'700'000'005'000);
    for (int r = 0; r < 2; ++r) {
      RankInfo info;
      info.rank = r;
      info.worker_id = "worker-00000" + std::to_string(r + 1);
      info.host = "h" + std::to_string(r);
      info.device = "cuda:" + std::to_string(r);
      info.local_size = 1;
      info.cross_rank = r;
      info.cross_size = 2;
      info.state = RankState::kStarted;
      job.ranks.push_back(info);
    }
    job.events.push_back({job.create_time, JobState::kPending, "registered: 2 ranks"});
    job.events.push_back({job.update_time, JobState::kRunning, "all 2 ranks started"});
    return job;
  }

  std::filesystem::path dir_;
};

TEST_F(SqliteJobStoreTest, AJobComesBackAsStoredAfterTheStoreIsOpenedAgain) {
  {
    std::unique_ptr<JobStore> store = Open();
    ASSERT_TRUE(store->Put(Running()).ok());
  }
  std::unique_ptr<JobStore> store = Open();
  absl::StatusOr<Job> job = store->Get("job-000007");
  ASSERT_TRUE(job.ok()) << job.status();
  const Job want = Running();
  EXPECT_EQ(job->spec.name, "train");
  EXPECT_THAT(job->spec.command, ::testing::ElementsAre("python3", "train.py"));
  EXPECT_EQ(job->spec.env.at("SEED"), "42");
  EXPECT_EQ(job->spec.working_dir, "/work");
  EXPECT_EQ(job->state, JobState::kRunning);
  EXPECT_EQ(job->reason, "all 2 ranks started");
  EXPECT_EQ(job->epoch, 3);
  EXPECT_EQ(job->create_time, want.create_time);
  EXPECT_EQ(job->update_time, want.update_time);
  ASSERT_EQ(job->ranks.size(), 2u);
  EXPECT_EQ(job->ranks[1].worker_id, "worker-000002");
  EXPECT_EQ(job->ranks[1].host, "h1");
  EXPECT_EQ(job->ranks[1].device, "cuda:1");
  EXPECT_EQ(job->ranks[1].cross_rank, 1);
  EXPECT_EQ(job->ranks[1].state, RankState::kStarted);
  ASSERT_EQ(job->events.size(), 2u);
  EXPECT_EQ(job->events[1].message, "all 2 ranks started");
  EXPECT_EQ(store->Get("job-000008").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SqliteJobStoreTest, ThePutReplacesAndTheListIsOldestFirst) {
  std::unique_ptr<JobStore> store = Open();
  Job a = Running(), b = Running();
  b.id = "job-000008";
  ASSERT_TRUE(store->Put(a).ok());
  ASSERT_TRUE(store->Put(b).ok());
  a.state = JobState::kSucceeded;
  ASSERT_TRUE(store->Put(a).ok());
  std::vector<Job> all = store->List();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].id, "job-000007");
  EXPECT_EQ(all[0].state, JobState::kSucceeded);
  EXPECT_EQ(all[1].id, "job-000008");
}

TEST_F(SqliteJobStoreTest, TheDatabaseIsInWalMode) {
  Open();
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir_ / "jobs.db").c_str(), &db), SQLITE_OK);
  sqlite3_stmt* q = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &q, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(q), SQLITE_ROW);
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(q, 0)), "wal");
  sqlite3_finalize(q);
  sqlite3_close(db);
}

TEST_F(SqliteJobStoreTest, ARegistryOverItNumbersOnAndKeepsTheJobsThatWereRunning) {
  FakeClock clock;
  const Job running = Running();
  {
    std::unique_ptr<JobStore> store = Open();
    ASSERT_TRUE(store->Put(running).ok());
  }
  JobRegistry registry(Open(), &clock);
  absl::StatusOr<Job> was = registry.Get("job-000007");
  ASSERT_TRUE(was.ok());
  // As it was: the coordinator resumes it (its ranks' daemons reattach).
  EXPECT_EQ(was->state, JobState::kRunning);
  ASSERT_EQ(was->ranks.size(), running.ranks.size());
  for (size_t i = 0; i < running.ranks.size(); ++i) {
    EXPECT_EQ(was->ranks[i].worker_id, running.ranks[i].worker_id);
    EXPECT_EQ(was->ranks[i].state, running.ranks[i].state);
  }
  JobSpec spec;
  spec.name = "next";
  spec.np = 1;
  spec.command = {"true"};
  absl::StatusOr<Job> next = registry.Register(spec);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->id, "job-000008");
}

TEST_F(SqliteJobStoreTest, ADirectoryThatCannotBeCreatedIsAnError) {
  absl::StatusOr<std::unique_ptr<JobStore>> store = OpenSqliteJobStore("/proc/no/such/dir");
  EXPECT_EQ(store.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(store.status().message()),
              ::testing::StartsWith("--state-dir /proc/no/such/dir: "));
}

}  // namespace
}  // namespace ringmaster
