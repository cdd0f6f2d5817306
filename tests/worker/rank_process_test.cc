#include "worker/rank_process.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/source_archive.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster {
namespace {

// Rank 1 of a 2-rank job on two hosts, with the job's own env over the daemon's.
v1::JobAssignment Assignment() {
  v1::JobAssignment a;
  a.set_rank(1);
  a.set_epoch(3);
  a.set_rendezvous_token("tok");
  v1::Job* job = a.mutable_job();
  job->set_id("job-000007");
  job->mutable_spec()->set_np(2);
  job->mutable_spec()->set_working_dir("/work");
  (*job->mutable_spec()->mutable_env())["PATH"] = "/job/bin";
  (*job->mutable_spec()->mutable_env())["NCCL_DEBUG"] = "INFO";
  for (int r = 0; r < 2; ++r) {
    v1::RankInfo* info = job->add_ranks();
    info->set_rank(r);
    info->set_host(r == 0 ? "h0" : "h1");
    info->set_local_rank(0);
    info->set_local_size(1);
    info->set_cross_rank(r);
    info->set_cross_size(2);
    info->set_address(r == 0 ? "10.0.0.1" : "10.0.0.2");
  }
  return a;
}

TEST(RankProcessTest, TheEnvironmentIsHorovodsTopologyTheJobsAndTheDaemons) {
  const RankPlace place{"/tmp/w.sock", "127.0.0.1:5000", "/var/rm/job-000007-3-rank-1"};
  const std::map<std::string, std::string> inherited = {
      {"PATH", "/usr/bin"}, {"HOME", "/root"}, {"RINGMASTER_RANK", "stale"}};
  std::map<std::string, std::string> env = RankEnvironment(Assignment(), place, inherited);
  const std::map<std::string, std::string> expected = {
      {"PATH", "/job/bin"},  // the job's over the daemon's
      {"HOME", "/root"},
      {"NCCL_DEBUG", "INFO"},
      {"RINGMASTER_RANK", "1"},  // the topology over both
      {"HOROVOD_RANK", "1"},
      {"RINGMASTER_SIZE", "2"},
      {"HOROVOD_SIZE", "2"},
      {"RINGMASTER_LOCAL_RANK", "0"},
      {"HOROVOD_LOCAL_RANK", "0"},
      {"RINGMASTER_LOCAL_SIZE", "1"},
      {"HOROVOD_LOCAL_SIZE", "1"},
      {"RINGMASTER_CROSS_RANK", "1"},
      {"HOROVOD_CROSS_RANK", "1"},
      {"RINGMASTER_CROSS_SIZE", "2"},
      {"HOROVOD_CROSS_SIZE", "2"},
      {"RINGMASTER_HOSTNAME", "h1"},
      {"HOROVOD_HOSTNAME", "h1"},
      {"RINGMASTER_SOCKET", "/tmp/w.sock"},
      {"RINGMASTER_COORDINATOR", "127.0.0.1:5000"},
      {"RINGMASTER_JOB_ID", "job-000007"},
      {"RINGMASTER_EPOCH", "3"},
      {"RINGMASTER_RENDEZVOUS_TOKEN", "tok"},
      {"RINGMASTER_ADDRESS", "10.0.0.2"},
      {"RINGMASTER_OUTPUT_DIR", "/var/rm/job-000007-3-rank-1/output"},
      {"SM_OUTPUT_DATA_DIR", "/var/rm/job-000007-3-rank-1/output"},
      {"SM_MODEL_DIR", "/var/rm/job-000007-3-rank-1/output"},
  };
  EXPECT_EQ(env, expected);
  EXPECT_EQ(RankWorkingDir(Assignment(), place), "/work");
}

TEST(RankProcessTest, CodeShippedWithTheJobIsItsWorkingDirAndAnElasticJobGetsItsTimeout) {
  v1::JobAssignment a = Assignment();
  a.mutable_job()->mutable_spec()->mutable_source()->set_sha256(std::string(64, 'a'));
  a.mutable_job()->mutable_spec()->set_min_np(1);
  const RankPlace place{"/s", "c", "/d"};
  std::map<std::string, std::string> env = RankEnvironment(a, place, {});
  EXPECT_EQ(env["RINGMASTER_CODE_DIR"], "/d/code");
  EXPECT_EQ(env["SM_MODULE_DIR"], "/d/code");
  EXPECT_EQ(env["RINGMASTER_ELASTIC_TIMEOUT"], "600");
  EXPECT_EQ(RankWorkingDir(a, place), "/d/code");
  a.mutable_job()->mutable_spec()->set_elastic_timeout_seconds(30);
  EXPECT_EQ(RankEnvironment(a, place, {})["RINGMASTER_ELASTIC_TIMEOUT"], "30");
}

TEST(RankProcessTest, TheRanksDirectoryIsMadeAfreshWithItsOutputAndTheJobsCodeUnpacked) {
  namespace fs = std::filesystem;
  const std::string work = ::testing::TempDir() + "/rank_process_test";
  fs::remove_all(work);
  fs::create_directories(work);
  const std::string expected_dir = absl::StrCat(work, "/job-000007-3-rank-1-", getpid());
  fs::create_directories(expected_dir + "/stale");  // a predecessor's leftovers
  auto no_fetch = [](const std::string&) { return absl::InternalError("not called"); };
  absl::StatusOr<std::string> dir = MakeRankDir(work, Assignment(), no_fetch);
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(*dir, expected_dir);
  EXPECT_TRUE(fs::is_directory(*dir + "/output"));
  EXPECT_FALSE(fs::exists(*dir + "/stale"));
  EXPECT_EQ(fs::status(*dir).permissions(), fs::perms::owner_all);

  // With code: the archive the fetch writes is unpacked into code/ and removed.
  const std::string src = work + "/src";
  fs::create_directories(src + "/pkg");
  std::ofstream(src + "/pkg/train.py") << "print('hi')\n";
  absl::StatusOr<std::string> packed = PackDirectory(src, 1 << 20);
  ASSERT_TRUE(packed.ok()) << packed.status();
  v1::JobAssignment with_code = Assignment();
  with_code.mutable_job()->mutable_spec()->mutable_source()->set_sha256(std::string(64, 'a'));
  dir = MakeRankDir(work, with_code, [&](const std::string& archive) {
    std::ofstream(archive, std::ios::binary) << *packed;
    return absl::OkStatus();
  });
  ASSERT_TRUE(dir.ok()) << dir.status();
  std::ifstream unpacked(*dir + "/code/pkg/train.py");
  std::string text((std::istreambuf_iterator<char>(unpacked)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "print('hi')\n");
  EXPECT_FALSE(fs::exists(*dir + "/source.tar.gz"));

  // A fetch that fails says so, and leaves nothing behind.
  dir = MakeRankDir(work, with_code, [](const std::string&) {
    return absl::UnavailableError("the coordinator is gone");
  });
  EXPECT_EQ(dir.status(),
            absl::UnavailableError("could not fetch the job's code: the coordinator is gone"));
  EXPECT_FALSE(fs::exists(expected_dir));
  fs::remove_all(work);
}

}  // namespace
}  // namespace ringmaster
