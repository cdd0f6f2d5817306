// A coordinator restarted over the same store resumes the jobs that were running: their workers
// reattach, a rank that lacks lists the others executed gets them, every rank then gets the first
// list of a new cache generation, batches of the old one are dropped, and a rank that does not
// come back fails the job, named. Two Coordinator objects over one store stand for the process
// before and after the restart.
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "coordinator/coordinator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster {
namespace {

using ::testing::ElementsAre;

// What a durable store is to a restarted coordinator: the same jobs.
class SharedStore : public JobStore {
 public:
  explicit SharedStore(std::shared_ptr<JobStore> store) : store_(std::move(store)) {}
  absl::Status Put(const Job& job) override { return store_->Put(job); }
  absl::StatusOr<Job> Get(const std::string& id) const override { return store_->Get(id); }
  std::vector<Job> List() const override { return store_->List(); }
  absl::Status Delete(const std::string& id) override { return store_->Delete(id); }

 private:
  std::shared_ptr<JobStore> store_;
};

class Recorder : public WorkerChannel {
 public:
  void SendAssignment(const Job& job, int rank) override {
    assignments.push_back(absl::StrCat(job.id, " rank ", rank));
  }
  void SendResponses(const std::shared_ptr<CycleBroadcast>& cycle, int rank) override {
    cycles.push_back(cycle);
    ranks.push_back(rank);
  }
  void SendRelayedResponses(const std::shared_ptr<CycleBroadcast>&,
                            const std::vector<int>&) override {}
  void SendStopJob(const std::string& job_id, const std::string& reason) override {
    stops.push_back(absl::StrCat(job_id, ": ", reason));
  }
  void SendResumed(const std::string& job_id, int64_t epoch, int rank,
                   uint64_t last_request_seq) override {
    resumed.push_back(absl::StrCat(job_id, "@", epoch, " rank ", rank, " has ", last_request_seq));
  }
  void SendShutdown(const std::string&) override {}
  void Close(const absl::Status&) override {}

  // "seq:generation:tensors" of each cycle received (and "!error" of a rank's errors).
  std::vector<std::string> Seen() const {
    std::vector<std::string> out;
    for (const auto& c : cycles) {
      std::string names;
      for (const Response& r : c->output.responses) {
        // A cached tensor goes by its id ("#1"), its name given once by the cache assignment.
        for (size_t i = 0; i < r.names.size(); ++i) {
          absl::StrAppend(&names, names.empty() ? "" : ",",
                          r.names[i].empty() ? absl::StrCat("#", r.cache_ids[i]) : r.names[i]);
        }
      }
      for (const RankNotice& n : c->output.notices) {
        for (const Response& e : n.errors) absl::StrAppend(&names, "!", e.error_message);
      }
      out.push_back(
          absl::StrCat(c->seq, ":", c->cache_generation == 0 ? "old" : "new", ":", names));
    }
    return out;
  }

  std::vector<std::string> assignments;
  std::vector<std::shared_ptr<CycleBroadcast>> cycles;
  std::vector<int> ranks;
  std::vector<std::string> stops;
  std::vector<std::string> resumed;
};

TensorRequest Allreduce(std::string name) {
  TensorRequest r;
  r.name = std::move(name);
  r.type = RequestType::kAllreduce;
  r.dtype = DataType::kFloat32;
  r.shape = {4};
  return r;
}

class CoordinatorRestoreTest : public ::testing::Test {
 protected:
  CoordinatorRestoreTest() : store_(JobStore::InMemory()) {
    before_ = Start();
    w_[0] = Connect(*before_, "h0", &old_[0]);
    w_[1] = Connect(*before_, "h1", &old_[1]);
    absl::StatusOr<Job> job = before_->RegisterJob(Spec());
    EXPECT_TRUE(job.ok()) << job.status();
    job_ = job->id;
    // Which worker serves which rank.
    for (const RankInfo& r : job->ranks) rank_of_[r.worker_id] = r.rank;
    for (int i = 0; i < 2; ++i) {
      EXPECT_TRUE(Update(*before_, i, RankState::kStarted).ok());
    }
    EXPECT_EQ(before_->GetJob(job_)->state, JobState::kRunning);
  }

  ~CoordinatorRestoreTest() override {
    after_.reset();
    before_.reset();
    std::error_code error;
    std::filesystem::remove_all(ArtifactsDir(), error);
  }

  static std::string ArtifactsDir() {
    return absl::StrCat(std::filesystem::temp_directory_path().string(), "/coordinator_restore_",
                        getpid());
  }

  static JobSpec Spec() {
    JobSpec spec;
    spec.name = "train";
    spec.np = 2;
    return spec;
  }

  std::unique_ptr<Coordinator> Start(absl::Duration resume_timeout = absl::Minutes(1)) {
    CoordinatorOptions o;
    o.clock = &clock_;
    o.store = std::make_unique<SharedStore>(store_);
    o.artifacts_dir = ArtifactsDir();
    o.resume_timeout = resume_timeout;
    return std::make_unique<Coordinator>(std::move(o));
  }

  std::string Connect(Coordinator& c, const std::string& host, Recorder* channel) {
    absl::StatusOr<Worker> w = c.RegisterWorker(host, "cpu", {});
    EXPECT_TRUE(w.ok()) << w.status();
    EXPECT_TRUE(c.OpenSession(w->id, channel).ok());
    return w->id;
  }

  int Rank(int worker) { return rank_of_.at(w_[worker]); }

  absl::Status Update(Coordinator& c, int worker, RankState state, int exit_code = 0) {
    RankUpdate u;
    u.job_id = job_;
    u.epoch = 1;
    u.rank = Rank(worker);
    u.state = state;
    u.exit_code = exit_code;
    return c.UpdateRank(w_[worker], u);
  }

  absl::Status Submit(Coordinator& c, int worker, const std::string& tensor, uint64_t seq,
                      uint64_t generation = 0) {
    RequestBatch b;
    b.job_id = job_;
    b.epoch = 1;
    b.rank = Rank(worker);
    b.requests = {Allreduce(tensor)};
    b.seq = seq;
    b.cache_generation = generation;
    absl::Status s = c.SubmitRequests(w_[worker], std::move(b));
    c.Tick();
    return s;
  }

  // Worker `worker` reattaches to the restarted coordinator: it received the lists up to `last`
  // and retained those in `retained` (cycles the old coordinator sent).
  void Reattach(int worker, uint64_t last, uint64_t last_request,
                std::vector<std::shared_ptr<CycleBroadcast>> retained) {
    ASSERT_TRUE(after_->OpenSession(w_[worker], &new_[worker]).ok());
    RankResume r;
    r.job_id = job_;
    r.epoch = 1;
    r.rank = Rank(worker);
    r.last_response_seq = last;
    r.last_request_seq = last_request;
    r.retained = std::move(retained);
    after_->ResumeRanks(w_[worker], &new_[worker], {r});
  }

  std::vector<std::string> Events() {
    std::vector<std::string> out;
    const absl::StatusOr<Job> job = after_->GetJob(job_);
    for (const JobEvent& e : job->events) out.push_back(e.message);
    return out;
  }

  FakeClock clock_;
  std::shared_ptr<JobStore> store_;
  Recorder old_[2], new_[2];
  std::string w_[2];
  std::map<std::string, int> rank_of_;
  std::string job_;
  std::unique_ptr<Coordinator> before_;
  std::unique_ptr<Coordinator> after_;
};

TEST_F(CoordinatorRestoreTest, ALaggingRankGetsWhatTheOthersExecutedThenEveryRankAsksAgain) {
  // Two cycles before the crash: worker 0 received both, worker 1 only the first.
  ASSERT_TRUE(Submit(*before_, 0, "a", 1).ok());
  ASSERT_TRUE(Submit(*before_, 1, "a", 1).ok());
  ASSERT_TRUE(Submit(*before_, 0, "b", 2).ok());
  ASSERT_TRUE(Submit(*before_, 1, "b", 2).ok());
  ASSERT_EQ(old_[0].Seen(), (std::vector<std::string>{"1:old:#1", "2:old:#2"}));
  const std::vector<std::shared_ptr<CycleBroadcast>> sent = old_[0].cycles;
  before_.reset();  // kill -9: nothing more is sent

  after_ = Start();
  // The job is as it was, its workers known again (not connected): no NOT_FOUND for them.
  EXPECT_EQ(after_->GetJob(job_)->state, JobState::kRunning);
  for (const Worker& w : after_->ListWorkers()) {
    EXPECT_EQ(w.state, WorkerState::kBusy) << w.id;
    EXPECT_FALSE(w.connected) << w.id;
  }
  EXPECT_EQ(Events().back(),
            "the coordinator restarted; waiting up to 1m for the job's 2 ranks to reattach");
  Reattach(0, 2, 2, sent);
  EXPECT_TRUE(new_[0].cycles.empty()) << "nothing until every rank is back";
  Reattach(1, 1, 2, {sent[0]});
  // The lagging rank gets list 2 (tensor b, which rank 0 executed), then both get the new
  // generation's first list; each is told which batch the coordinator has.
  EXPECT_EQ(new_[1].Seen(), (std::vector<std::string>{"2:old:#2", "3:new:"}));
  EXPECT_EQ(new_[0].Seen(), (std::vector<std::string>{"3:new:"}));
  EXPECT_THAT(new_[0].resumed, ElementsAre(absl::StrCat(job_, "@1 rank ", Rank(0), " has 2")));
  EXPECT_THAT(new_[1].resumed, ElementsAre(absl::StrCat(job_, "@1 rank ", Rank(1), " has 2")));
  EXPECT_TRUE(absl::StartsWith(Events().back(),
                               "resumed after the coordinator restart: every rank reattached"))
      << Events().back();

  // A batch encoded in the old generation is dropped; the same request in the new one counts.
  const uint64_t generation = new_[0].cycles.back()->cache_generation;
  ASSERT_NE(generation, 0u);
  ASSERT_TRUE(Submit(*after_, 0, "c", 3, /*generation=*/0).ok());
  ASSERT_TRUE(Submit(*after_, 1, "c", 3, generation).ok());
  EXPECT_EQ(new_[0].Seen(), (std::vector<std::string>{"3:new:"})) << "rank 0's c was dropped";
  ASSERT_TRUE(Submit(*after_, 0, "c", 4, generation).ok());
  EXPECT_EQ(new_[0].Seen(), (std::vector<std::string>{"3:new:", "4:new:#1"}));
  EXPECT_EQ(new_[1].Seen(), (std::vector<std::string>{"2:old:#2", "3:new:", "4:new:#1"}));
  clock_.Advance(absl::Milliseconds(250));  // not counted: the note says when the cycle came
  EXPECT_EQ(Events().back(),
            "negotiating again: the first cycle after the restart came 0 after the coordinator "
            "started");
  // The new generation's cache starts afresh: c is its first entry.
  ASSERT_EQ(new_[0].cycles.back()->output.cache_assignments.size(), 1u);
  EXPECT_EQ(new_[0].cycles.back()->output.cache_assignments[0].name, "c");

  // The job ends as any other.
  ASSERT_TRUE(Update(*after_, 0, RankState::kExited).ok());
  ASSERT_TRUE(Update(*after_, 1, RankState::kExited).ok());
  EXPECT_EQ(after_->GetJob(job_)->state, JobState::kSucceeded);
  EXPECT_EQ(after_->GetJob(job_)->reason, "all 2 ranks exited 0");
}

TEST_F(CoordinatorRestoreTest, ARankThatDoesNotReattachFailsTheJobAtTheResumeTimeoutNamingIt) {
  before_.reset();
  after_ = Start(absl::Seconds(5));
  Reattach(0, 0, 0, {});
  for (int i = 0; i < 6; ++i) {
    clock_.Advance(absl::Seconds(1));
    ASSERT_TRUE(after_->Heartbeat(w_[0]).ok());
    after_->Tick();
  }
  const Job job = *after_->GetJob(job_);
  EXPECT_EQ(job.state, JobState::kFailed);
  EXPECT_EQ(job.reason, absl::StrCat("1 rank did not reattach within 5s of the coordinator's "
                                     "restart (--resume-timeout): rank ",
                                     Rank(1), " on host h1 (", w_[1], ")"));
  // The rank that came back is stopped.
  EXPECT_THAT(new_[0].stops, ElementsAre(absl::StrCat(job_, ": ", job.reason)));
}

TEST_F(CoordinatorRestoreTest, ARankLackingAListNoRankKeptFailsTheJobSayingWhich) {
  ASSERT_TRUE(Submit(*before_, 0, "a", 1).ok());
  ASSERT_TRUE(Submit(*before_, 1, "a", 1).ok());
  before_.reset();
  after_ = Start();
  Reattach(0, 1, 1, {});  // it applied list 1 and kept nothing (told every rank had it)
  Reattach(1, 0, 1, {});
  const Job job = *after_->GetJob(job_);
  EXPECT_EQ(job.state, JobState::kFailed);
  EXPECT_EQ(job.reason, absl::StrCat("rank ", Rank(1),
                                     " had received response list 0 when the coordinator "
                                     "restarted, other ranks list 1, and no rank kept list 1: the "
                                     "job cannot resume"));
}

TEST_F(CoordinatorRestoreTest, AWorkerIdIsNeverGivenTwiceAcrossARestart) {
  before_.reset();
  after_ = Start();
  Recorder fresh;
  const std::string id = Connect(*after_, "h2", &fresh);
  EXPECT_EQ(id, "worker-000003");  // after worker-000001 and -000002 of the stored job
  // A worker that reattaches without its rank while it had started holds nothing: the restore
  // goes on without it, and its exit report (it follows) fails the job.
  ASSERT_TRUE(after_->OpenSession(w_[0], &new_[0]).ok());
  after_->ResumeRanks(w_[0], &new_[0], {});
  Reattach(1, 0, 0, {});
  EXPECT_EQ(new_[1].Seen(), (std::vector<std::string>{"1:new:"}));
  EXPECT_TRUE(new_[0].cycles.empty());
  ASSERT_TRUE(Update(*after_, 0, RankState::kExited, 1).ok());
  for (int i = 0; i < 5; ++i) {
    clock_.Advance(absl::Milliseconds(100));
    after_->Tick();
  }
  EXPECT_EQ(after_->GetJob(job_)->state, JobState::kFailed);
  EXPECT_TRUE(absl::StartsWith(
      after_->GetJob(job_)->reason,
      absl::StrCat("rank ", Rank(0), " on host h0 (", w_[0], ") exited with status 1")))
      << after_->GetJob(job_)->reason;
}

TEST_F(CoordinatorRestoreTest, AnIdleDaemonsOldIdGivenToAnotherDaemonIsRefusedToIt) {
  // An idle daemon before the restart: its id is in no job, so it is not reserved.
  absl::StatusOr<Worker> idle = before_->RegisterWorker("h2", "cpu", {}, /*incarnation=*/7);
  ASSERT_TRUE(idle.ok());
  EXPECT_EQ(idle->id, "worker-000003");
  before_.reset();
  after_ = Start();
  // Another daemon registers first and is given that id...
  absl::StatusOr<Worker> fresh = after_->RegisterWorker("h3", "cpu", {}, /*incarnation=*/9);
  ASSERT_TRUE(fresh.ok());
  ASSERT_EQ(fresh->id, "worker-000003");
  Recorder a, b;
  ASSERT_TRUE(after_->OpenSession(fresh->id, &a, 9).ok());
  // ... so the idle daemon's session under it is refused (it registers again), and the other's
  // session stays.
  const absl::Status s = after_->OpenSession("worker-000003", &b, 7);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "worker_id 'worker-000003' belongs to another daemon now; register again");
  // A restored worker takes the first daemon that reattaches; another one is refused.
  ASSERT_TRUE(after_->OpenSession(w_[0], &new_[0], 41).ok());
  EXPECT_EQ(after_->OpenSession(w_[0], &new_[1], 42).code(), absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorRestoreTest, AJobWhoseRanksAllExitedBeforeTheRestartEndsAsTheyDid) {
  // Both exits recorded, the job's end not yet (a success is posted, a failure settles first).
  ASSERT_TRUE(Update(*before_, 0, RankState::kExited, 0).ok());
  ASSERT_TRUE(Update(*before_, 1, RankState::kExited, 3).ok());
  before_.reset();
  after_ = Start();
  const Job job = *after_->GetJob(job_);
  EXPECT_EQ(job.state, JobState::kFailed);
  EXPECT_EQ(job.reason,
            absl::StrCat("rank ", Rank(1), " on host h1 (", w_[1], ") exited with status 3"));
}

TEST_F(CoordinatorRestoreTest, AJobWhoseRanksAllExitedZeroBeforeTheRestartSucceeds) {
  ASSERT_TRUE(Update(*before_, 0, RankState::kExited, 0).ok());
  // The second exit is recorded by hand: the first coordinator would end the job on it at once.
  Job stored = *store_->Get(job_);
  for (RankInfo& r : stored.ranks) r.state = RankState::kExited;
  before_.reset();
  ASSERT_TRUE(store_->Put(stored).ok());
  after_ = Start();
  EXPECT_EQ(after_->GetJob(job_)->state, JobState::kSucceeded);
  EXPECT_EQ(after_->GetJob(job_)->reason, "all 2 ranks exited 0");
}

}  // namespace
}  // namespace ringmaster
