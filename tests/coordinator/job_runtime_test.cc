#include "coordinator/job_runtime.h"

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ringmaster {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

Job PlacedJob(int np) {
  Job job;
  job.id = "job-000001";
  job.epoch = 1;
  job.spec.name = "train";
  job.spec.np = np;
  for (int r = 0; r < np; ++r) {
    RankInfo info;
    info.rank = r;
    info.worker_id = "worker-00000" + std::to_string(r + 1);
    info.host = "h0";
    info.device = "cpu";
    job.ranks.push_back(info);
  }
  return job;
}

TensorRequest Allreduce(std::string name, int64_t elements) {
  TensorRequest r;
  r.name = std::move(name);
  r.type = RequestType::kAllreduce;
  r.dtype = DataType::kFloat32;
  r.shape = {elements};
  return r;
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class JobRuntimeTest : public ::testing::Test {
 protected:
  JobRuntimeTest()
      : dir_(std::filesystem::temp_directory_path() /
             ("job_runtime_test-" + std::to_string(::getpid()))),
        artifacts_(dir_.string()) {}
  ~JobRuntimeTest() override { std::filesystem::remove_all(dir_); }

  std::shared_ptr<JobRuntime> Open(const Job& job) {
    std::vector<std::string> problems;
    auto runtime =
        JobRuntime::Open(job, artifacts_, metrics_, Executor::Inline(), start_, &problems);
    EXPECT_THAT(problems, IsEmpty());
    return runtime;
  }

  // Flushes at `now`; returns the cycles delivered.
  std::vector<std::shared_ptr<CycleBroadcast>> Flush(JobRuntime& runtime, absl::Time now) {
    std::vector<std::shared_ptr<CycleBroadcast>> delivered;
    runtime.Flush(now, [&](const std::shared_ptr<CycleBroadcast>& c) { delivered.push_back(c); });
    return delivered;
  }

  const std::filesystem::path dir_;
  const ArtifactStore artifacts_;
  MetricsRegistry metrics_;
  const absl::Time start_ = absl::FromUnixSeconds(1'000'000);
};

TEST_F(JobRuntimeTest, ACycleIsDeliveredOnceEveryRankSubmittedAndCounted) {
  auto runtime = Open(PlacedJob(2));
  EXPECT_EQ(runtime->job_id(), "job-000001");
  EXPECT_EQ(runtime->epoch(), 1);
  runtime->Submit(0, {Allreduce("w", 250)}, {}, start_);
  EXPECT_THAT(Flush(*runtime, start_), IsEmpty());  // rank 1 has not submitted
  runtime->Submit(1, {Allreduce("w", 250)}, {}, start_);
  auto delivered = Flush(*runtime, start_ + absl::Milliseconds(1));
  ASSERT_EQ(delivered.size(), 1u);
  EXPECT_EQ(delivered[0]->job_id, "job-000001");
  ASSERT_EQ(delivered[0]->output.responses.size(), 1u);
  EXPECT_THAT(delivered[0]->output.responses[0].tensor_sizes, ElementsAre(250));
  EXPECT_EQ(delivered[0]->fusion_threshold_bytes, int64_t{128} << 20);
  const JobThroughput t = runtime->Throughput(absl::InfiniteFuture());
  EXPECT_EQ(t.tensors_negotiated, 1);
  EXPECT_EQ(t.bytes_negotiated, 1000);
  EXPECT_NE(
      metrics_.Exposition().find("ringmaster_negotiation_cycles_total{job=\"job-000001\"} 1\n"),
      std::string::npos)
      << metrics_.Exposition();
}

TEST_F(JobRuntimeTest, ABatchReSentAfterAReconnectIsDroppedAndCyclesAreNumbered) {
  auto runtime = Open(PlacedJob(2));
  EXPECT_TRUE(runtime->Submit(0, {Allreduce("w", 4)}, {}, start_, /*seq=*/1));
  EXPECT_FALSE(runtime->Submit(0, {Allreduce("w", 4)}, {}, start_, /*seq=*/1));  // again
  EXPECT_EQ(runtime->LastRequestSeq(0), 1u);
  EXPECT_TRUE(runtime->Submit(1, {Allreduce("w", 4)}, {}, start_, /*seq=*/1));
  auto first = Flush(*runtime, start_ + absl::Milliseconds(1));
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0]->seq, 1u);
  // Had the duplicate been negotiated, "w" would be in flight twice on rank 0: the second cycle
  // has exactly one response for the next step.
  EXPECT_TRUE(runtime->Submit(0, {Allreduce("w", 4)}, {}, start_, 2));
  EXPECT_TRUE(runtime->Submit(1, {Allreduce("w", 4)}, {}, start_, 2));
  auto second = Flush(*runtime, start_ + absl::Milliseconds(2));
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0]->seq, 2u);
  EXPECT_EQ(second[0]->output.responses.size(), 1u);
  EXPECT_THAT(Flush(*runtime, start_ + absl::Milliseconds(3)), IsEmpty());
}

TEST_F(JobRuntimeTest, AReconnectedRankGetsTheListsItMissedUntilEveryRankHasThem) {
  auto runtime = Open(PlacedJob(2));
  for (uint64_t step = 1; step <= 3; ++step) {
    runtime->Submit(0, {Allreduce("w", 4)}, {}, start_, step, /*ack_responses=*/step - 1);
    runtime->Submit(1, {Allreduce("w", 4)}, {}, start_, step, /*ack_responses=*/0);
    ASSERT_EQ(Flush(*runtime, start_ + absl::Milliseconds(step)).size(), 1u);
  }
  // Rank 1 received list 1 only before its session broke: 2 and 3 again, in order.
  std::vector<uint64_t> resent;
  ASSERT_TRUE(
      runtime
          ->Resend(1, 1,
                   [&](const std::shared_ptr<CycleBroadcast>& c) { resent.push_back(c->seq); })
          .ok());
  EXPECT_THAT(resent, ElementsAre(2, 3));
  EXPECT_EQ(runtime->LastRequestSeq(1), 3u);
  // Rank 0 acknowledged up to 2, rank 1 (by resuming) up to 1: list 1 is forgotten, 2 and 3 kept.
  resent.clear();
  ASSERT_TRUE(
      runtime
          ->Resend(0, 0,
                   [&](const std::shared_ptr<CycleBroadcast>& c) { resent.push_back(c->seq); })
          .ok());
  EXPECT_THAT(resent, ElementsAre(2, 3));
}

TEST_F(JobRuntimeTest, EveryFewCyclesAListCarriesTheRequestAcknowledgements) {
  auto runtime = Open(PlacedJob(2));
  std::vector<std::shared_ptr<CycleBroadcast>> lists;
  for (uint64_t step = 1; step <= JobRuntime::kAckEvery; ++step) {
    runtime->Submit(0, {Allreduce("w", 4)}, {}, start_, step);
    runtime->Submit(1, {Allreduce("w", 4)}, {}, start_, 100 + step);  // numbering is per rank
    for (auto& c : Flush(*runtime, start_ + absl::Milliseconds(step))) lists.push_back(c);
  }
  ASSERT_EQ(lists.size(), JobRuntime::kAckEvery);
  EXPECT_THAT(lists[0]->request_acks, IsEmpty());
  EXPECT_THAT(lists.back()->request_acks,
              ElementsAre(JobRuntime::kAckEvery, 100 + JobRuntime::kAckEvery));
}

TEST_F(JobRuntimeTest, AClosedRuntimeDeliversNothingAndItsTimelineIsWholeJson) {
  Job job = PlacedJob(1);
  job.spec.knobs.timeline = "timeline.json";
  auto runtime = Open(job);
  ASSERT_TRUE(runtime->Timeline().has_value());
  EXPECT_EQ(runtime->Timeline()->name, "timeline.json");
  runtime->Submit(0, {Allreduce("w", 4)}, {}, start_);
  EXPECT_EQ(Flush(*runtime, start_ + absl::Milliseconds(1)).size(), 1u);
  runtime->Close();
  runtime->Close();  // idempotent
  runtime->Submit(0, {Allreduce("x", 4)}, {}, start_ + absl::Seconds(1));
  EXPECT_THAT(Flush(*runtime, start_ + absl::Seconds(2)), IsEmpty());
  const nlohmann::json trace =
      nlohmann::json::parse(Read(artifacts_.PathOf("job-000001", "timeline.json")));
  ASSERT_TRUE(trace.is_array());
  // Written up to its end: the negotiation of "w" is in it, nothing of "x".
  const std::string text = trace.dump();
  EXPECT_NE(text.find("\"w\""), std::string::npos) << text;
  EXPECT_EQ(text.find("\"x\""), std::string::npos) << text;
}

TEST_F(JobRuntimeTest, TheAutotuneLogHasItsHeaderFromTheStart) {
  Job job = PlacedJob(1);
  job.spec.knobs.autotune = true;
  job.spec.knobs.autotune_log = "autotune.csv";
  auto runtime = Open(job);
  runtime->Close();
  const std::string log = Read(artifacts_.PathOf("job-000001", "autotune.csv"));
  EXPECT_EQ(log, std::string(kAutotuneLogHeader) + "\n");
}

TEST_F(JobRuntimeTest, AFileThatCannotBeCreatedIsAProblemAndTheJobRunsWithoutIt) {
  Job job = PlacedJob(1);
  job.spec.knobs.timeline = "no-such-dir/timeline.json";
  std::vector<std::string> problems;
  auto runtime = JobRuntime::Open(job, artifacts_, metrics_, Executor::Inline(), start_, &problems);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0].rfind("no timeline: ", 0), 0u) << problems[0];
  EXPECT_FALSE(runtime->Timeline().has_value());
  runtime->Submit(0, {Allreduce("w", 4)}, {}, start_);
  EXPECT_EQ(Flush(*runtime, start_ + absl::Milliseconds(1)).size(), 1u);
}

}  // namespace
}  // namespace ringmaster
