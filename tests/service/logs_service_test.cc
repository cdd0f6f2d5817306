// Job output over gRPC: simulated workers forward their ranks' output on their Session streams
// (WorkerMessage.output), and JobService.GetLogs reads it back, once or following the job to its
// end.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/sim_worker.h"
#include "coordinator/server.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "ringmaster/v1/job.grpc.pb.h"
#include "ringmaster/v1/worker.grpc.pb.h"

namespace ringmaster {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr absl::Duration kWait = absl::Seconds(10);
// How long a failed job's log still takes its other ranks' output.
constexpr absl::Duration kLinger = absl::Milliseconds(300);

std::unique_ptr<grpc::ClientContext> Ctx() {
  auto c = std::make_unique<grpc::ClientContext>();
  c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return c;
}

// "rank:stream:data" of a chunk.
std::string Text(const v1::LogChunk& c) {
  return absl::StrCat(c.rank(),
                      c.stream() == v1::RANK_OUTPUT_STREAM_STDERR ? ":err:" : ":out:", c.data());
}

class LogsServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorOptions options;
    options.log_linger = kLinger;
    options.housekeeping_interval = absl::Milliseconds(20);
    server_ = std::make_unique<CoordinatorServer>(std::move(options));
    absl::StatusOr<int> port = server_->Start("127.0.0.1:0");
    ASSERT_TRUE(port.ok()) << port.status();
    channel_ =
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", *port), grpc::InsecureChannelCredentials());
    jobs_ = v1::JobService::NewStub(channel_);
  }

  void TearDown() override {
    sims_.clear();
    server_->Stop();
  }

  SimWorker& AddWorker(const std::string& host) {
    sims_.push_back(std::make_unique<SimWorker>(channel_, host));
    absl::Status s = sims_.back()->Connect();
    EXPECT_TRUE(s.ok()) << s;
    return *sims_.back();
  }

  v1::Job Submit(int np) {
    v1::RegisterJobRequest request;
    request.mutable_spec()->set_name("logs-test");
    request.mutable_spec()->set_np(np);
    request.mutable_spec()->add_command("train");
    v1::RegisterJobResponse response;
    grpc::Status s = jobs_->RegisterJob(Ctx().get(), request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response.job();
  }

  // Two workers on two hosts running a 2-rank job; a_[r] and w_[r] are rank r's.
  v1::Job StartTwoRanks() {
    SimWorker& x = AddWorker("h0");
    SimWorker& y = AddWorker("h1");
    v1::Job job = Submit(2);
    auto ax = x.WaitAssignment(kWait);
    auto ay = y.WaitAssignment(kWait);
    EXPECT_TRUE(ax.ok() && ay.ok());
    if (!ax.ok() || !ay.ok()) return job;
    const bool x_first = ax->rank() == 0;
    w_ = {x_first ? &x : &y, x_first ? &y : &x};
    a_ = {x_first ? *ax : *ay, x_first ? *ay : *ax};
    return job;
  }

  static v1::WorkerMessage Output(const v1::JobAssignment& a, v1::RankOutput::Stream stream,
                                  const std::string& data) {
    v1::WorkerMessage m;
    v1::RankOutput* o = m.mutable_output();
    o->set_job_id(a.job().id());
    o->set_epoch(a.epoch());
    o->set_rank(a.rank());
    o->set_stream(stream);
    o->set_data(data);
    return m;
  }

  void Say(int rank, const std::string& data,
           v1::RankOutput::Stream stream = v1::RankOutput::STREAM_STDOUT) {
    ASSERT_TRUE(w_[rank]->Send(Output(a_[rank], stream, data)).ok());
  }

  // GetLogs without follow: every chunk, as text, and the call's status.
  std::vector<std::string> Logs(const v1::GetLogsRequest& request, grpc::Status* status = nullptr) {
    auto context = Ctx();
    auto reader = jobs_->GetLogs(context.get(), request);
    std::vector<std::string> out;
    v1::GetLogsResponse response;
    while (reader->Read(&response)) {
      for (const v1::LogChunk& c : response.chunks()) out.push_back(Text(c));
    }
    grpc::Status s = reader->Finish();
    if (status != nullptr) *status = s;
    EXPECT_TRUE(status != nullptr || s.ok()) << s.error_message();
    return out;
  }

  std::vector<std::string> AllLogs(const std::string& job_id) {
    v1::GetLogsRequest request;
    request.set_job_id(job_id);
    request.set_all_ranks(true);
    return Logs(request);
  }

  // Polls (non-following reads) until the job's log has `n` chunks or the deadline passes.
  std::vector<std::string> AwaitLogs(const std::string& job_id, size_t n) {
    const absl::Time deadline = absl::Now() + kWait;
    std::vector<std::string> logs = AllLogs(job_id);
    while (logs.size() < n && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));
      logs = AllLogs(job_id);
    }
    return logs;
  }

  v1::JobState State(const std::string& job_id) {
    v1::GetJobRequest request;
    request.set_job_id(job_id);
    v1::GetJobResponse response;
    EXPECT_TRUE(jobs_->GetJob(Ctx().get(), request, &response).ok());
    return response.job().state();
  }

  // Polls until the job is in `state` or the deadline passes; returns the last state seen.
  v1::JobState AwaitState(const std::string& job_id, v1::JobState state) {
    const absl::Time deadline = absl::Now() + kWait;
    v1::JobState now = State(job_id);
    while (now != state && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
      now = State(job_id);
    }
    return now;
  }

  std::unique_ptr<CoordinatorServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::vector<std::unique_ptr<SimWorker>> sims_;
  std::vector<SimWorker*> w_;
  std::vector<v1::JobAssignment> a_;
};

TEST_F(LogsServiceTest, OutputOfEveryRankIsReadBackInOrderAndByRank) {
  v1::Job job = StartTwoRanks();
  ASSERT_EQ(w_.size(), 2u);
  Say(0, "hello from 0\n");
  ASSERT_THAT(AwaitLogs(job.id(), 1), ElementsAre("0:out:hello from 0\n"));
  Say(1, "hello from 1\n");
  ASSERT_EQ(AwaitLogs(job.id(), 2).size(), 2u);
  Say(1, "warning: x\n", v1::RankOutput::STREAM_STDERR);
  EXPECT_THAT(AwaitLogs(job.id(), 3),
              ElementsAre("0:out:hello from 0\n", "1:out:hello from 1\n", "1:err:warning: x\n"));

  v1::GetLogsRequest one;
  one.set_job_id(job.id());
  one.set_rank(1);
  EXPECT_THAT(Logs(one), ElementsAre("1:out:hello from 1\n", "1:err:warning: x\n"));
  one.set_rank(-1);  // every rank, as all_ranks
  EXPECT_EQ(Logs(one).size(), 3u);

  // The logs outlive the job.
  ASSERT_TRUE(w_[0]->SendRankUpdate(a_[0], v1::RANK_STATE_EXITED, 0).ok());
  ASSERT_TRUE(w_[1]->SendRankUpdate(a_[1], v1::RANK_STATE_EXITED, 0).ok());
  ASSERT_EQ(AwaitState(job.id(), v1::JOB_STATE_SUCCEEDED), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(AllLogs(job.id()).size(), 3u);
}

TEST_F(LogsServiceTest, UnknownJobsAndRanksOutOfRangeAreRefused) {
  v1::Job job = Submit(2);
  v1::GetLogsRequest request;
  request.set_job_id("job-424242");
  grpc::Status status;
  EXPECT_THAT(Logs(request, &status), IsEmpty());
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(status.error_message(), "job 'job-424242' not found");

  request.set_job_id(job.id());
  request.set_rank(2);
  Logs(request, &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(),
            absl::StrCat("rank = 2 is out of bounds [0, 1] of job ", job.id()));
  request.set_rank(-2);
  request.set_follow(true);
  Logs(request, &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  // A pending job has no output yet.
  request.set_rank(0);
  request.set_follow(false);
  EXPECT_THAT(Logs(request, &status), IsEmpty());
  EXPECT_TRUE(status.ok()) << status.error_message();
}

TEST_F(LogsServiceTest, OutputFromAWorkerNotServingTheRankIsRefusedAndNotStored) {
  v1::Job job = StartTwoRanks();
  ASSERT_EQ(w_.size(), 2u);
  SimWorker& idle = AddWorker("h2");
  // The idle worker pretends to be rank 0; rank 1's worker claims rank 0 too.
  ASSERT_TRUE(idle.Send(Output(a_[0], v1::RankOutput::STREAM_STDOUT, "forged\n")).ok());
  v1::JobAssignment wrong_rank = a_[1];
  wrong_rank.set_rank(0);
  ASSERT_TRUE(w_[1]->Send(Output(wrong_rank, v1::RankOutput::STREAM_STDOUT, "forged\n")).ok());
  // A stale epoch, an unspecified stream and more than 1 MiB are refused as well.
  v1::JobAssignment stale = a_[0];
  stale.set_epoch(stale.epoch() + 1);
  ASSERT_TRUE(w_[0]->Send(Output(stale, v1::RankOutput::STREAM_STDOUT, "stale\n")).ok());
  ASSERT_TRUE(w_[0]->Send(Output(a_[0], v1::RankOutput::STREAM_UNSPECIFIED, "which?\n")).ok());
  ASSERT_TRUE(
      w_[0]
          ->Send(Output(a_[0], v1::RankOutput::STREAM_STDOUT, std::string((1 << 20) + 1, 'x')))
          .ok());
  // Exactly 1 MiB is fine; a session handles its messages in order, so once these are stored, the
  // refused ones before them were handled.
  Say(0, std::string(1 << 20, 'y'));
  Say(1, "real\n");
  std::vector<std::string> logs = AwaitLogs(job.id(), 2);
  ASSERT_EQ(logs.size(), 2u);
  EXPECT_THAT(
      logs, ::testing::UnorderedElementsAre("0:out:" + std::string(1 << 20, 'y'), "1:out:real\n"));
  // The idle worker's message was handled (and refused) before its next one is answered.
  v1::WorkerMessage batch;
  batch.mutable_requests()->set_job_id(job.id());
  batch.mutable_requests()->set_epoch(a_[0].epoch());
  batch.mutable_requests()->set_rank(0);
  ASSERT_TRUE(idle.Send(batch).ok());
  ASSERT_TRUE(idle.WaitStop(kWait).ok());
  EXPECT_EQ(AllLogs(job.id()).size(), 2u);
  // Refused output does not end a session: the workers and the job go on.
  Say(0, "still here\n");
  EXPECT_EQ(AwaitLogs(job.id(), 3).back(), "0:out:still here\n");
  EXPECT_EQ(State(job.id()), v1::JOB_STATE_STARTING);
}

TEST_F(LogsServiceTest, AFollowerSeesNewOutputAndItsStreamEndsWhenTheJobEnds) {
  v1::Job job = StartTwoRanks();
  ASSERT_EQ(w_.size(), 2u);
  Say(0, "before\n");
  ASSERT_EQ(AwaitLogs(job.id(), 1).size(), 1u);

  v1::GetLogsRequest request;
  request.set_job_id(job.id());
  request.set_all_ranks(true);
  request.set_follow(true);
  auto context = Ctx();
  auto reader = jobs_->GetLogs(context.get(), request);
  std::vector<std::string> seen;
  v1::GetLogsResponse response;
  auto read_until = [&](size_t n) {
    while (seen.size() < n && reader->Read(&response)) {
      for (const v1::LogChunk& c : response.chunks()) seen.push_back(Text(c));
    }
  };
  read_until(1);
  EXPECT_THAT(seen, ElementsAre("0:out:before\n"));
  Say(1, "during\n");
  read_until(2);
  EXPECT_THAT(seen, ElementsAre("0:out:before\n", "1:out:during\n"));

  // Rank 1's last words precede its exit on its session, so the follower gets them. Rank 0's,
  // racing the job's end, are still taken for the linger; then the stream ends.
  Say(1, "Traceback: boom\n", v1::RankOutput::STREAM_STDERR);
  ASSERT_TRUE(w_[1]->SendRankUpdate(a_[1], v1::RANK_STATE_EXITED, 3, "boom").ok());
  read_until(3);
  ASSERT_EQ(AwaitState(job.id(), v1::JOB_STATE_FAILED), v1::JOB_STATE_FAILED);
  const absl::Time failed = absl::Now();
  Say(0, "Terminated\n", v1::RankOutput::STREAM_STDERR);
  read_until(4);
  EXPECT_FALSE(reader->Read(&response));  // the job FAILED and its log ended: the stream ends
  EXPECT_GE(absl::Now() - failed, kLinger - absl::Milliseconds(50));
  grpc::Status status = reader->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_THAT(seen, ElementsAre("0:out:before\n", "1:out:during\n", "1:err:Traceback: boom\n",
                                "0:err:Terminated\n"));

  // Output after the log ended is refused. Rank 0's worker was told to stop; a batch it sends after
  // its late output is answered with another stop, so by then the late output was handled.
  Say(0, "too late\n");
  ASSERT_TRUE(w_[0]->WaitStop(kWait).ok());
  v1::WorkerMessage batch;
  batch.mutable_requests()->set_job_id(job.id());
  batch.mutable_requests()->set_epoch(a_[0].epoch());
  batch.mutable_requests()->set_rank(0);
  ASSERT_TRUE(w_[0]->Send(batch).ok());
  ASSERT_TRUE(w_[0]->WaitStop(kWait).ok());
  // Following an ended job returns its logs and ends at once.
  v1::GetLogsRequest rank0 = request;
  rank0.set_all_ranks(false);
  rank0.set_rank(0);
  EXPECT_THAT(Logs(rank0), ElementsAre("0:out:before\n", "0:err:Terminated\n"));
}

TEST_F(LogsServiceTest, FollowingAJobThatNeverRanEndsWhenItIsCancelled) {
  v1::Job job = Submit(4);  // no workers: it stays PENDING
  v1::GetLogsRequest request;
  request.set_job_id(job.id());
  request.set_all_ranks(true);
  request.set_follow(true);
  auto context = Ctx();
  auto reader = jobs_->GetLogs(context.get(), request);
  v1::CancelJobRequest cancel;
  cancel.set_job_id(job.id());
  v1::CancelJobResponse cancelled;
  ASSERT_TRUE(jobs_->CancelJob(Ctx().get(), cancel, &cancelled).ok());
  v1::GetLogsResponse response;
  EXPECT_FALSE(reader->Read(&response));
  grpc::Status status = reader->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
}

}  // namespace
}  // namespace ringmaster
