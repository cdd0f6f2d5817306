// The coordinator glue, driven as the services drive it, with a FakeClock and recording channels:
// no server, no sockets, no sleeps.
#include "coordinator/coordinator.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/worker_channel.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ringmaster {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::SizeIs;

// Records every call. The coordinator calls it on the test's thread only, so it needs no lock.
class RecordingChannel : public WorkerChannel {
 public:
  struct Assignment {
    Job job;
    int rank;
  };
  struct Delivery {
    std::shared_ptr<CycleBroadcast> cycle;
    int rank;
  };
  struct Relayed {
    std::shared_ptr<CycleBroadcast> cycle;
    std::vector<int> ranks;
  };
  struct Stop {
    std::string job_id;
    std::string reason;
    bool operator==(const Stop&) const = default;
  };

  void SendAssignment(const Job& job, int rank) override { assignments.push_back({job, rank}); }
  void SendResponses(const std::shared_ptr<CycleBroadcast>& cycle, int rank) override {
    deliveries.push_back({cycle, rank});
  }
  void SendRelayedResponses(const std::shared_ptr<CycleBroadcast>& cycle,
                            const std::vector<int>& ranks) override {
    relayed.push_back({cycle, ranks});
  }
  void SendStopJob(const std::string& job_id, const std::string& reason) override {
    stops.push_back({job_id, reason});
  }
  void SendStopEpoch(const std::string& job_id, int64_t epoch, const std::string& reason) override {
    stopped_epochs.push_back(absl::StrCat(job_id, "@", epoch, ": ", reason));
  }
  void SendHostsUpdated(const std::string& job_id, int64_t epoch) override {
    hosts_updated.push_back(absl::StrCat(job_id, "@", epoch));
  }
  void SendShutdown(const std::string& reason) override { shutdowns.push_back(reason); }
  void Close(const absl::Status& status) override { closes.push_back(status); }
  void SendResumed(const std::string& job_id, int64_t epoch, int rank,
                   uint64_t last_request_seq) override {
    resumed.push_back(absl::StrCat(job_id, "@", epoch, " rank ", rank, " has ", last_request_seq));
  }

  std::vector<Assignment> assignments;
  std::vector<Delivery> deliveries;
  std::vector<Relayed> relayed;
  std::vector<Stop> stops;
  std::vector<std::string> shutdowns;
  std::vector<absl::Status> closes;
  std::vector<std::string> resumed;
  std::vector<std::string> stopped_epochs;
  std::vector<std::string> hosts_updated;
};

std::ostream& operator<<(std::ostream& os, const RecordingChannel::Stop& s) {
  return os << "Stop{" << s.job_id << ", " << s.reason << "}";
}

std::string Describe(const Response& r) {
  static constexpr const char* kTypes[] = {"allreduce", "allgather", "broadcast",
                                           "join",      "barrier",   "error"};
  std::string s = absl::StrCat(kTypes[static_cast<int>(r.type)], " [", absl::StrJoin(r.names, ","),
                               "] ids [", absl::StrJoin(r.cache_ids, ","), "] sizes [",
                               absl::StrJoin(r.tensor_sizes, ","), "]");
  if (!r.error_message.empty()) absl::StrAppend(&s, " error: ", r.error_message);
  return s;
}

std::vector<std::string> Describe(const CycleOutput& out) {
  std::vector<std::string> all;
  for (const Response& r : out.responses) all.push_back(Describe(r));
  return all;
}

JobSpec Spec(int np, int processes_per_host = 0) {
  JobSpec spec;
  spec.name = "train";
  spec.np = np;
  spec.processes_per_host = processes_per_host;
  return spec;
}

TensorRequest Allreduce(std::string name, std::vector<int64_t> shape = {4}) {
  TensorRequest r;
  r.name = std::move(name);
  r.type = RequestType::kAllreduce;
  r.dtype = DataType::kFloat32;
  r.shape = std::move(shape);
  return r;
}

class CoordinatorTest : public ::testing::Test {
 protected:
  CoordinatorTest() : coordinator_(Options(&clock_)) {}

  static CoordinatorOptions Options(Clock* clock) {
    CoordinatorOptions o;
    o.clock = clock;
    o.artifacts_dir = ArtifactsDir();
    return o;  // lease 10 s, housekeeping every 100 ms
  }

  static std::string ArtifactsDir() {
    return absl::StrCat(std::filesystem::temp_directory_path().string(), "/coordinator_test_",
                        getpid());
  }

  ~CoordinatorTest() override {
    std::error_code error;
    std::filesystem::remove_all(ArtifactsDir(), error);
  }

  // The whole artifact as a reader would get it.
  std::string ReadArtifact(const std::string& job_id, const std::string& name) {
    absl::StatusOr<Coordinator::ArtifactSnapshot> s = coordinator_.SnapshotArtifact(job_id, name);
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return "";
    absl::StatusOr<std::string> data = coordinator_.ReadArtifact(job_id, name, 0, s->size);
    EXPECT_TRUE(data.ok()) << data.status();
    return data.ok() ? *data + s->tail : "";
  }

  // Registers a worker and opens its session with a recording channel; returns its id.
  std::string Connect(const std::string& host, const std::string& device,
                      const std::string& identity = "") {
    absl::StatusOr<Worker> w = coordinator_.RegisterWorker(host, device, {}, 0, "", identity);
    EXPECT_TRUE(w.ok()) << w.status();
    if (!w.ok()) return "";
    channels_[w->id] = std::make_unique<RecordingChannel>();
    EXPECT_TRUE(coordinator_.OpenSession(w->id, channels_[w->id].get()).ok());
    return w->id;
  }

  RecordingChannel& Channel(const std::string& worker_id) { return *channels_.at(worker_id); }

  // Workers w[0], w[1] on host-a and w[2], w[3] on host-b, and a job of 4 ranks, 2 per host,
  // rank i on w[i], with a negotiation relay for every `relay_hosts` hosts. Host-b's workers
  // register as `identity_b` (host-a's as "node"). Returns the job's id.
  std::string TwoHostJob(std::vector<std::string>* w, int relay_hosts = 1,
                         const std::string& identity_b = "node") {
    for (const char* host : {"host-a", "host-a", "host-b", "host-b"}) {
      w->push_back(Connect(host, "cpu", host == std::string("host-a") ? "node" : identity_b));
    }
    JobSpec spec = Spec(4, 2);
    spec.knobs.negotiation_relay = true;
    spec.knobs.negotiation_relay_hosts = relay_hosts;
    const std::string id = coordinator_.RegisterJob(spec)->id;
    const Job job = GetJob(id);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(job.ranks[i].worker_id, (*w)[i]) << i;
    return id;
  }

  Job GetJob(const std::string& id) {
    absl::StatusOr<Job> job = coordinator_.GetJob(id);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : Job{};
  }

  Worker GetWorker(const std::string& id) {
    for (const Worker& w : coordinator_.ListWorkers()) {
      if (w.id == id) return w;
    }
    ADD_FAILURE() << "no worker " << id;
    return Worker{};
  }

  absl::Status Submit(const std::string& worker_id, const std::string& job_id, int rank,
                      std::vector<TensorRequest> requests, std::vector<uint32_t> ids = {},
                      int64_t epoch = 1) {
    RequestBatch batch;
    batch.job_id = job_id;
    batch.epoch = epoch;
    batch.rank = rank;
    batch.requests = std::move(requests);
    batch.cached_ids = std::move(ids);
    return coordinator_.SubmitRequests(worker_id, std::move(batch));
  }

  absl::Status Update(const std::string& worker_id, const std::string& job_id, int rank,
                      RankState state, int exit_code = 0, std::string message = "",
                      bool failed = false) {
    RankUpdate u;
    u.job_id = job_id;
    u.epoch = 1;
    u.rank = rank;
    u.state = state;
    u.exit_code = exit_code;
    u.message = std::move(message);
    u.failed = failed;
    return coordinator_.UpdateRank(worker_id, u);
  }

  // Moves time forward in steps no longer than `step`, heartbeating `alive` and ticking after each,
  // as a live server would.
  void RunFor(absl::Duration total, const std::vector<std::string>& alive,
              absl::Duration step = absl::Seconds(5)) {
    while (total > absl::ZeroDuration()) {
      const absl::Duration d = std::min(step, total);
      clock_.Advance(d);
      total -= d;
      for (const std::string& id : alive) EXPECT_TRUE(coordinator_.Heartbeat(id).ok()) << id;
      coordinator_.Tick();
    }
  }

  // Every channel in `ranks` (indexed by rank) received the same cycles, in the same order, each
  // addressed to its own rank. Returns the cycles.
  std::vector<std::shared_ptr<CycleBroadcast>> SameCycles(const std::vector<std::string>& ranks) {
    std::vector<std::shared_ptr<CycleBroadcast>> cycles;
    for (const RecordingChannel::Delivery& d : Channel(ranks[0]).deliveries) {
      cycles.push_back(d.cycle);
    }
    for (size_t r = 0; r < ranks.size(); ++r) {
      const auto& got = Channel(ranks[r]).deliveries;
      EXPECT_EQ(got.size(), cycles.size()) << "rank " << r;
      for (size_t k = 0; k < std::min(got.size(), cycles.size()); ++k) {
        EXPECT_EQ(got[k].rank, static_cast<int>(r));
        EXPECT_EQ(got[k].cycle.get(), cycles[k].get()) << "rank " << r << " cycle " << k;
        EXPECT_EQ(Describe(got[k].cycle->output), Describe(cycles[k]->output));
      }
    }
    return cycles;
  }

  // Declared in this order so the coordinator, which borrows both, goes first.
  FakeClock clock_;
  std::map<std::string, std::unique_ptr<RecordingChannel>> channels_;
  Coordinator coordinator_;
};

// ---- Scheduling and the rank lifecycle ----

TEST_F(CoordinatorTest, AssignmentsReachEachWorkerWithItsRankPlacement) {
  const std::string w1 = Connect("host-b", "cuda:1");
  const std::string w2 = Connect("host-a", "cuda:10");
  const std::string w3 = Connect("host-a", "cuda:2");
  const std::string w4 = Connect("host-b", "cuda:0");
  absl::StatusOr<Job> job = coordinator_.RegisterJob(Spec(4));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->id, "job-000001");
  EXPECT_EQ(job->state, JobState::kStarting);
  EXPECT_EQ(job->epoch, 1);
  std::vector<std::string> messages;
  for (const JobEvent& e : job->events) messages.push_back(e.message);
  EXPECT_THAT(messages,
              ElementsAre("registered: 4 ranks", "scheduled 4 ranks on 2 hosts: host-a, host-b"));

  // (worker, rank, host, device, local_rank, local_size, cross_rank, cross_size)
  struct Expected {
    std::string worker;
    int rank;
    std::string host, device;
    int local_rank, local_size, cross_rank, cross_size;
  };
  const Expected expected[] = {{w3, 0, "host-a", "cuda:2", 0, 2, 0, 2},
                               {w2, 1, "host-a", "cuda:10", 1, 2, 0, 2},
                               {w4, 2, "host-b", "cuda:0", 0, 2, 1, 2},
                               {w1, 3, "host-b", "cuda:1", 1, 2, 1, 2}};
  for (const Expected& e : expected) {
    SCOPED_TRACE(e.worker);
    const RecordingChannel& ch = Channel(e.worker);
    ASSERT_THAT(ch.assignments, SizeIs(1));
    const Job& sent = ch.assignments[0].job;
    EXPECT_EQ(ch.assignments[0].rank, e.rank);
    EXPECT_EQ(sent.id, "job-000001");
    EXPECT_EQ(sent.state, JobState::kStarting);
    EXPECT_EQ(sent.epoch, 1);
    ASSERT_THAT(sent.ranks, SizeIs(4));
    const RankInfo& r = sent.ranks[e.rank];
    EXPECT_EQ(r.rank, e.rank);
    EXPECT_EQ(r.worker_id, e.worker);
    EXPECT_EQ(r.host, e.host);
    EXPECT_EQ(r.device, e.device);
    EXPECT_EQ(r.local_rank, e.local_rank);
    EXPECT_EQ(r.local_size, e.local_size);
    EXPECT_EQ(r.cross_rank, e.cross_rank);
    EXPECT_EQ(r.cross_size, e.cross_size);
    const Worker w = GetWorker(e.worker);
    EXPECT_EQ(w.state, WorkerState::kBusy);
    EXPECT_EQ(w.job_id, "job-000001");
    EXPECT_EQ(w.rank, e.rank);
  }
}

TEST_F(CoordinatorTest, AnAttachedJobIsPlacedWhereItsProcessesClaimedTheirRanks) {
  const std::string a0 = Connect("host-a", "cpu");
  const std::string a1 = Connect("host-a", "cpu");
  const std::string b0 = Connect("host-b", "cpu");
  const std::string spare = Connect("host-c", "cpu");
  // Before the job exists, a claim finds nothing.
  absl::Status s = coordinator_.ClaimRank(a0, "train", 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(),
            "no attached job named 'train' is pending (submit one: ringmaster submit --attached "
            "--name train --np N)");

  JobSpec spec = Spec(3);
  spec.name = "train";
  spec.command.clear();
  spec.attached = true;
  absl::StatusOr<Job> job = coordinator_.RegisterJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  // Idle workers are there, but an attached job waits for its claims.
  EXPECT_EQ(job->state, JobState::kPending);
  EXPECT_EQ(GetJob(job->id).events.back().message,
            "waiting for its ranks to be claimed by attached training processes");

  s = coordinator_.ClaimRank(a0, "train", 3);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "rank 3 is not a rank of job job-000001 ('train', np 3)");
  ASSERT_TRUE(coordinator_.ClaimRank(b0, "train", 0).ok());
  ASSERT_TRUE(coordinator_.ClaimRank(b0, "train", 0).ok());  // again: a no-op
  s = coordinator_.ClaimRank(a0, "train", 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(s.message(), absl::StrCat("rank 0 of job job-000001 is claimed by worker ", b0,
                                      " on host-b already"));
  s = coordinator_.ClaimRank(b0, "train", 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), absl::StrCat("worker ", b0,
                                      " already holds rank 0 of job job-000001: "
                                      "one rank per worker (is one training process per slot "
                                      "attached?)"));
  ASSERT_TRUE(coordinator_.ClaimRank(a1, "train", 2).ok());

  // A scheduled job meanwhile takes only unclaimed workers: a0 (hosts of equal room go in name
  // order), not a1 or b0.
  absl::StatusOr<Job> other = coordinator_.RegisterJob(Spec(1));
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->state, JobState::kStarting);
  ASSERT_THAT(other->ranks, SizeIs(1));
  EXPECT_EQ(other->ranks[0].worker_id, a0);
  EXPECT_EQ(GetJob(job->id).state, JobState::kPending);
  // A busy worker cannot claim.
  s = coordinator_.ClaimRank(a0, "train", 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            absl::StrCat("worker ", a0, " is not idle: it cannot take rank 1 of job job-000001"));

  // The last claim places the job: rank r on the worker that claimed it.
  const std::string last = spare;
  ASSERT_TRUE(coordinator_.ClaimRank(last, "train", 1).ok());
  const Job placed = GetJob(job->id);
  EXPECT_EQ(placed.state, JobState::kStarting);
  EXPECT_EQ(placed.events.back().message,
            "placed 3 ranks where their processes attached, on 3 hosts: host-b, host-c, host-a");
  ASSERT_THAT(placed.ranks, SizeIs(3));
  EXPECT_EQ(placed.ranks[0].worker_id, b0);
  EXPECT_EQ(placed.ranks[1].worker_id, last);
  EXPECT_EQ(placed.ranks[2].worker_id, a1);
  for (const std::string& w : {b0, last, a1}) {
    ASSERT_THAT(Channel(w).assignments, SizeIs(1)) << w;
    EXPECT_EQ(Channel(w).assignments[0].job.id, job->id);
    EXPECT_EQ(GetWorker(w).state, WorkerState::kBusy);
  }
  EXPECT_EQ(Channel(b0).assignments[0].rank, 0);
  EXPECT_EQ(Channel(last).assignments[0].rank, 1);
  EXPECT_EQ(Channel(a1).assignments[0].rank, 2);
  // Once placed, the name takes no more claims.
  EXPECT_EQ(coordinator_.ClaimRank(spare, "train", 0).code(), absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorTest, AnAttachedJobTakesNoCommandNorSource) {
  JobSpec spec = Spec(2);
  spec.command = {"python3", "train.py"};
  spec.attached = true;
  absl::StatusOr<Job> job = coordinator_.RegisterJob(spec);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(job.status().message(),
            "spec.command must be empty for an attached job (spec.attached): its ranks are the "
            "training processes that attach and claim them, not processes the workers start");
}

TEST_F(CoordinatorTest, GangIsPlacedWholeOrNotAtAll) {
  const std::string w1 = Connect("host-a", "cuda:0");
  const std::string w2 = Connect("host-a", "cuda:1");
  absl::StatusOr<Worker> unconnected = coordinator_.RegisterWorker("host-b", "cuda:0", {});
  ASSERT_TRUE(unconnected.ok());

  absl::StatusOr<Job> job = coordinator_.RegisterJob(Spec(3));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state, JobState::kPending);
  EXPECT_THAT(job->ranks, IsEmpty());
  EXPECT_THAT(Channel(w1).assignments, IsEmpty());
  EXPECT_THAT(Channel(w2).assignments, IsEmpty());
  EXPECT_EQ(GetWorker(w1).state, WorkerState::kIdle);
  EXPECT_EQ(GetWorker(w2).state, WorkerState::kIdle);

  // A third worker connecting completes the gang.
  channels_[unconnected->id] = std::make_unique<RecordingChannel>();
  ASSERT_TRUE(coordinator_.OpenSession(unconnected->id, channels_[unconnected->id].get()).ok());
  EXPECT_EQ(GetJob(job->id).state, JobState::kStarting);
  for (const std::string& w : {w1, w2, unconnected->id}) {
    EXPECT_THAT(Channel(w).assignments, SizeIs(1)) << w;
    EXPECT_EQ(GetWorker(w).state, WorkerState::kBusy) << w;
  }
}

TEST_F(CoordinatorTest, AtMostProcessesPerHost) {
  for (int d = 0; d < 3; ++d) Connect("host-a", absl::StrCat("cuda:", d));
  Connect("host-b", "cuda:0");
  absl::StatusOr<Job> job = coordinator_.RegisterJob(Spec(4, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state, JobState::kPending);  // host-b has only one worker

  Connect("host-b", "cuda:1");
  Job started = GetJob(job->id);
  ASSERT_EQ(started.state, JobState::kStarting);
  std::vector<std::string> placed;
  for (const RankInfo& r : started.ranks) placed.push_back(absl::StrCat(r.host, "/", r.device));
  EXPECT_THAT(placed,
              ElementsAre("host-a/cuda:0", "host-a/cuda:1", "host-b/cuda:0", "host-b/cuda:1"));
  EXPECT_EQ(GetWorker("worker-000003").state, WorkerState::kIdle);  // host-a cuda:2
}

TEST_F(CoordinatorTest, RanksStartedMakeTheJobRunningAndAllExitedZeroSucceeds) {
  const std::string w1 = Connect("host-a", "cuda:0");
  const std::string w2 = Connect("host-a", "cuda:1");
  const std::string id = coordinator_.RegisterJob(Spec(2))->id;

  ASSERT_TRUE(Update(w1, id, 0, RankState::kStarted).ok());
  EXPECT_EQ(GetJob(id).state, JobState::kStarting);
  ASSERT_TRUE(Update(w2, id, 1, RankState::kStarted).ok());
  Job job = GetJob(id);
  EXPECT_EQ(job.state, JobState::kRunning);
  EXPECT_EQ(job.events.back().message, "all 2 ranks started");
  EXPECT_EQ(job.ranks[0].state, RankState::kStarted);

  ASSERT_TRUE(Update(w2, id, 1, RankState::kExited, 0).ok());
  EXPECT_EQ(GetJob(id).state, JobState::kRunning);
  ASSERT_TRUE(Update(w1, id, 0, RankState::kExited, 0).ok());
  job = GetJob(id);
  EXPECT_EQ(job.state, JobState::kSucceeded);
  EXPECT_EQ(job.reason, "all 2 ranks exited 0");
  EXPECT_EQ(job.events.back().state, JobState::kSucceeded);
  EXPECT_EQ(GetWorker(w1).state, WorkerState::kIdle);
  EXPECT_EQ(GetWorker(w2).state, WorkerState::kIdle);
  EXPECT_EQ(GetWorker(w1).job_id, "");

  absl::Status late = Update(w1, id, 0, RankState::kStarted);
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(late.message(),
            "worker worker-000001 is not assigned rank 0 of job job-000001, which is SUCCEEDED");
}

TEST_F(CoordinatorTest, NonzeroExitFailsTheJobNamingTheRankAndStopsTheOthers) {
  const std::string w1 = Connect("host-a", "cuda:0");
  const std::string w2 = Connect("host-a", "cuda:1");
  const std::string w3 = Connect("host-b", "cuda:0");
  const std::string id = coordinator_.RegisterJob(Spec(3))->id;
  for (auto [w, r] : {std::pair{w1, 0}, std::pair{w2, 1}, std::pair{w3, 2}}) {
    ASSERT_TRUE(Update(w, id, r, RankState::kStarted).ok());
  }
  ASSERT_EQ(GetJob(id).state, JobState::kRunning);

  ASSERT_TRUE(Update(w2, id, 1, RankState::kExited, 3, "CUDA error: out of memory").ok());
  const std::string reason =
      "rank 1 on host host-a (worker-000002) exited with status 3: CUDA error: out of memory";
  // The failure settles for 300 ms (a peer's broken session would be named first), then lands.
  clock_.Advance(absl::Milliseconds(299));
  coordinator_.Tick();
  EXPECT_EQ(GetJob(id).state, JobState::kRunning);
  clock_.Advance(absl::Milliseconds(1));
  coordinator_.Tick();
  Job job = GetJob(id);
  EXPECT_EQ(job.state, JobState::kFailed);
  EXPECT_EQ(job.reason, reason);
  EXPECT_THAT(Channel(w1).stops, ElementsAre(RecordingChannel::Stop{id, reason}));
  EXPECT_THAT(Channel(w3).stops, ElementsAre(RecordingChannel::Stop{id, reason}));
  EXPECT_THAT(Channel(w2).stops, IsEmpty());  // its process has already exited
  for (const std::string& w : {w1, w2, w3}) EXPECT_EQ(GetWorker(w).state, WorkerState::kIdle);

  // The freed workers take the next job; an exit without a message names just the status.
  const std::string next = coordinator_.RegisterJob(Spec(3))->id;
  ASSERT_EQ(GetJob(next).state, JobState::kStarting);
  ASSERT_TRUE(Update(w3, next, 2, RankState::kExited, -9).ok());
  clock_.Advance(absl::Milliseconds(300));
  coordinator_.Tick();
  EXPECT_EQ(GetJob(next).reason, "rank 2 on host host-b (worker-000003) exited with status -9");
  EXPECT_EQ(GetJob(next).state, JobState::kFailed);
}

TEST_F(CoordinatorTest, ARankKilledWhilePeersWaitFailsTheJobWithItsOwnExitNotTheSymptom) {
  const std::string w1 = Connect("host-a", "cuda:0");
  const std::string w2 = Connect("host-b", "cuda:0");
  const std::string id = coordinator_.RegisterJob(Spec(2))->id;
  for (auto [w, r] : {std::pair{w1, 0}, std::pair{w2, 1}}) {
    ASSERT_TRUE(Update(w, id, r, RankState::kStarted).ok());
  }
  ASSERT_TRUE(Submit(w1, id, 0, {Allreduce("grad")}).ok());
  // Rank 1 is killed: rank 0's allreduce fails at once, but the job's reason is the kill.
  ASSERT_TRUE(Update(w2, id, 1, RankState::kExited, 137, "killed by signal 9 (Killed)").ok());
  ASSERT_TRUE(Update(w1, id, 0, RankState::kExited, 1, "allreduce failed").ok());
  clock_.Advance(absl::Milliseconds(300));
  coordinator_.Tick();
  EXPECT_EQ(GetJob(id).state, JobState::kFailed);
  EXPECT_EQ(GetJob(id).reason,
            "rank 1 on host host-b (worker-000002) exited with status 137: killed by signal 9 "
            "(Killed)");

  // A rank that exits 0 with a peer waiting: the job fails with the collective that could never
  // complete, and the waiting rank's exit (the symptom) does not take its place.
  const std::string next = coordinator_.RegisterJob(Spec(2))->id;
  for (auto [w, r] : {std::pair{w1, 0}, std::pair{w2, 1}}) {
    ASSERT_TRUE(Update(w, next, r, RankState::kStarted).ok());
  }
  ASSERT_TRUE(Submit(w1, next, 0, {Allreduce("grad")}).ok());
  ASSERT_TRUE(Update(w2, next, 1, RankState::kExited, 0).ok());
  ASSERT_TRUE(Update(w1, next, 0, RankState::kExited, 1, "allreduce failed").ok());
  clock_.Advance(absl::Milliseconds(300));
  coordinator_.Tick();
  EXPECT_EQ(GetJob(next).state, JobState::kFailed);
  EXPECT_EQ(GetJob(next).reason,
            "Allreduce of tensor 'grad' can never complete: rank 1 on host host-b (worker-000002) "
            "exited with status 0 before submitting it (one of the ranks finished execution).");
}

TEST_F(CoordinatorTest, ARanksFailedDataPlaneFailsTheJobWithItsMessageAndStopsEveryRank) {
  const std::string w1 = Connect("host-a", "cuda:0");
  const std::string w2 = Connect("host-b", "cuda:0");
  const std::string id = coordinator_.RegisterJob(Spec(2))->id;
  for (auto [w, r] : {std::pair{w1, 0}, std::pair{w2, 1}}) {
    ASSERT_TRUE(Update(w, id, r, RankState::kStarted).ok());
  }
  // Its NCCL communicator failed; its training process still runs.
  ASSERT_TRUE(Update(w2, id, 1, RankState::kExited, 1,
                     "NCCL error on rank 1 (host-b, cuda:0): a remote peer failed or exited, or "
                     "the network broke (ncclRemoteError)",
                     /*failed=*/true)
                  .ok());
  clock_.Advance(absl::Milliseconds(300));
  coordinator_.Tick();
  const std::string reason =
      "rank 1 on host host-b (worker-000002) failed: NCCL error on rank 1 (host-b, cuda:0): a "
      "remote peer failed or exited, or the network broke (ncclRemoteError)";
  EXPECT_EQ(GetJob(id).state, JobState::kFailed);
  EXPECT_EQ(GetJob(id).reason, reason);
  // The failed rank's process is stopped too.
  EXPECT_THAT(Channel(w1).stops, ElementsAre(RecordingChannel::Stop{id, reason}));
  EXPECT_THAT(Channel(w2).stops, ElementsAre(RecordingChannel::Stop{id, reason}));
}

TEST_F(CoordinatorTest, ARanksFirstExitStandsSoAFailureIsNotTurnedIntoSuccess) {
  const std::string w1 = Connect("host-a", "cuda:0");
  const std::string id = coordinator_.RegisterJob(Spec(1))->id;
  ASSERT_TRUE(Update(w1, id, 0, RankState::kStarted).ok());
  ASSERT_TRUE(Update(w1, id, 0, RankState::kExited, 1, "NCCL error on rank 0 (host-a, cuda:0): x",
                     /*failed=*/true)
                  .ok());
  // Its process then exits 0 (it caught the error): the failure stands.
  ASSERT_TRUE(Update(w1, id, 0, RankState::kExited, 0).ok());
  clock_.Advance(absl::Milliseconds(300));
  coordinator_.Tick();
  EXPECT_EQ(GetJob(id).state, JobState::kFailed);
  EXPECT_EQ(
      GetJob(id).reason,
      "rank 0 on host host-a (worker-000001) failed: NCCL error on rank 0 (host-a, cuda:0): x");
}

TEST_F(CoordinatorTest, CancelStopsEveryRankAndFreesTheWorkers) {
  const std::string w1 = Connect("host-a", "cuda:0");
  const std::string w2 = Connect("host-a", "cuda:1");
  const std::string id = coordinator_.RegisterJob(Spec(2))->id;

  absl::StatusOr<Job> cancelled = coordinator_.CancelJob(id, "");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state, JobState::kCancelled);
  EXPECT_EQ(cancelled->reason, "cancelled by user");
  EXPECT_THAT(Channel(w1).stops, ElementsAre(RecordingChannel::Stop{id, "cancelled by user"}));
  EXPECT_THAT(Channel(w2).stops, ElementsAre(RecordingChannel::Stop{id, "cancelled by user"}));
  EXPECT_EQ(GetWorker(w1).state, WorkerState::kIdle);
  EXPECT_EQ(GetWorker(w2).state, WorkerState::kIdle);

  absl::StatusOr<Job> again = coordinator_.CancelJob(id, "");
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(again.status().message(), "job job-000001 is CANCELLED; it cannot become CANCELLED");
  EXPECT_EQ(coordinator_.CancelJob("job-000042", "").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(coordinator_.CancelJob(id, std::string(1025, 'r')).status().message(),
            "reason is longer than 1024 bytes");

  const std::string second = coordinator_.RegisterJob(Spec(2))->id;
  absl::StatusOr<Job> with_reason = coordinator_.CancelJob(second, "preempted");
  ASSERT_TRUE(with_reason.ok());
  EXPECT_EQ(with_reason->reason, "cancelled: preempted");

  // A pending job has no ranks to stop.
  const std::string pending = coordinator_.RegisterJob(Spec(5))->id;
  ASSERT_EQ(GetJob(pending).state, JobState::kPending);
  ASSERT_TRUE(coordinator_.CancelJob(pending, "").ok());
  EXPECT_EQ(GetJob(pending).state, JobState::kCancelled);
  EXPECT_THAT(Channel(w1).stops, SizeIs(2));
}

// ---- Leases ----

TEST_F(CoordinatorTest, LostLeaseFailsOnlyTheJobOfTheLostWorker) {
  const std::string a0 = Connect("host-a", "cuda:0");
  const std::string a1 = Connect("host-a", "cuda:1");
  const std::string b0 = Connect("host-b", "cuda:0");
  const std::string b1 = Connect("host-b", "cuda:1");
  const std::string job_a = coordinator_.RegisterJob(Spec(2))->id;
  const std::string job_b = coordinator_.RegisterJob(Spec(2))->id;
  ASSERT_EQ(GetJob(job_a).ranks[1].worker_id, a1);
  ASSERT_EQ(GetJob(job_b).ranks[0].worker_id, b0);

  // a1 stops heartbeating; the others keep going.
  clock_.Advance(absl::Seconds(6));
  for (const std::string& w : {a0, b0, b1}) ASSERT_TRUE(coordinator_.Heartbeat(w).ok());
  clock_.Advance(absl::Milliseconds(3900));  // a1: 9.9 s
  coordinator_.Tick();
  EXPECT_EQ(GetJob(job_a).state, JobState::kStarting);
  EXPECT_EQ(GetWorker(a1).state, WorkerState::kBusy);

  clock_.Advance(absl::Milliseconds(100));  // a1: 10 s
  coordinator_.Tick();
  const std::string reason =
      "worker worker-000002 serving rank 1 on host host-a was lost: no heartbeat for 10s";
  Job failed = GetJob(job_a);
  EXPECT_EQ(failed.state, JobState::kFailed);
  EXPECT_EQ(failed.reason, reason);
  ASSERT_THAT(Channel(a1).closes, SizeIs(1));
  EXPECT_EQ(Channel(a1).closes[0].code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Channel(a1).closes[0].message(),
            "worker worker-000002 lost its lease (no heartbeat for 10s); register again");
  EXPECT_THAT(Channel(a0).stops, ElementsAre(RecordingChannel::Stop{job_a, reason}));
  EXPECT_THAT(Channel(a1).stops, IsEmpty());
  EXPECT_EQ(GetWorker(a0).state, WorkerState::kIdle);
  EXPECT_EQ(GetWorker(a1).state, WorkerState::kLost);

  // The other job is untouched.
  EXPECT_EQ(GetJob(job_b).state, JobState::kStarting);
  for (const std::string& w : {b0, b1}) {
    EXPECT_THAT(Channel(w).stops, IsEmpty()) << w;
    EXPECT_THAT(Channel(w).closes, IsEmpty()) << w;
    EXPECT_EQ(GetWorker(w).state, WorkerState::kBusy) << w;
    EXPECT_EQ(GetWorker(w).job_id, job_b) << w;
  }

  // The lost worker must register again.
  EXPECT_EQ(coordinator_.Heartbeat(a1).code(), absl::StatusCode::kFailedPrecondition);
  RecordingChannel fresh;
  absl::Status reopen = coordinator_.OpenSession(a1, &fresh);
  EXPECT_EQ(reopen.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(reopen.message(), "worker worker-000002 on host-a lost its lease; register again");
}

// ---- Elastic jobs ----

JobSpec Elastic(int min_np, int max_np, int reset_limit = 0, int timeout_seconds = 0) {
  JobSpec spec;
  spec.name = "elastic";
  spec.min_np = min_np;
  spec.max_np = max_np;
  spec.reset_limit = reset_limit;
  spec.elastic_timeout_seconds = timeout_seconds;
  return spec;
}

TEST_F(CoordinatorTest, AnElasticJobStartsWithTheWorkersThereAreBetweenMinAndMax) {
  const std::string a = Connect("host-a", "cpu");
  absl::StatusOr<Job> job = coordinator_.RegisterJob(Elastic(2, 4));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.np, 4);  // np defaults to max_np until placed
  EXPECT_EQ(GetJob(job->id).state, JobState::kPending);
  EXPECT_EQ(GetJob(job->id).waiting_reason, "needs 2 idle cpu slots; 1 registered, 1 idle");
  const std::string b = Connect("host-b", "cpu");  // min_np are there: it starts
  Job placed = GetJob(job->id);
  EXPECT_EQ(placed.state, JobState::kStarting);
  EXPECT_EQ(placed.spec.np, 2);
  ASSERT_THAT(placed.ranks, SizeIs(2));
  EXPECT_EQ(placed.ranks[0].worker_id, a);
  EXPECT_EQ(placed.ranks[1].worker_id, b);
  ASSERT_THAT(Channel(b).assignments, SizeIs(1));
  EXPECT_EQ(Channel(b).assignments[0].job.spec.np, 2);
  // Three free workers for a job of at most 2: it takes 2.
  for (const char* host : {"host-c", "host-d", "host-e"}) Connect(host, "cpu");
  absl::StatusOr<Job> two = coordinator_.RegisterJob(Elastic(1, 2));
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(GetJob(two->id).ranks.size(), 2u);

  // Bad bounds name the field.
  absl::StatusOr<Job> bad = coordinator_.RegisterJob(Elastic(3, 2));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "spec.min_np = 3 is out of bounds [1, np = 2]");
  JobSpec limit = Spec(2);
  limit.reset_limit = 3;
  EXPECT_EQ(coordinator_.RegisterJob(limit).status().message(),
            "spec.reset_limit and spec.elastic_timeout_seconds need an elastic job (spec.min_np "
            "or spec.max_np)");
}

TEST_F(CoordinatorTest, ALostWorkerStartsANewEpochWithTheOthersRenumbered) {
  const std::string a = Connect("host-a", "cpu");
  const std::string b = Connect("host-b", "cpu");
  const std::string c = Connect("host-c", "cpu");
  const std::string id = coordinator_.RegisterJob(Elastic(2, 3))->id;
  for (const auto& [w, r] : {std::pair{a, 0}, {b, 1}, {c, 2}}) {
    ASSERT_TRUE(Update(w, id, r, RankState::kStarted).ok());
  }
  ASSERT_EQ(GetJob(id).state, JobState::kRunning);

  // b stops heartbeating: lost after the 10 s lease, then the failure settles (300 ms).
  RunFor(absl::Milliseconds(10500), {a, c}, absl::Milliseconds(500));
  Job job = GetJob(id);
  EXPECT_EQ(job.state, JobState::kRunning);
  EXPECT_EQ(job.epoch, 2);
  EXPECT_EQ(job.resets, 1);
  EXPECT_EQ(job.spec.np, 2);
  ASSERT_THAT(job.ranks, SizeIs(2));
  EXPECT_EQ(job.ranks[0].worker_id, a);
  EXPECT_EQ(job.ranks[1].worker_id, c);  // rank 2 became rank 1
  EXPECT_EQ(job.ranks[1].state, RankState::kStarted);
  EXPECT_EQ(job.events.back().message,
            absl::StrCat("epoch 2: 2 ranks (2 kept, 0 added); gone: rank 1 on host host-b (", b,
                         "); because worker ", b,
                         " serving rank 1 on host host-b was lost: no heartbeat for 10s"));
  EXPECT_EQ(GetWorker(c).rank, 1);
  EXPECT_EQ(GetWorker(b).state, WorkerState::kLost);
  ASSERT_THAT(Channel(c).assignments, SizeIs(2));
  EXPECT_EQ(Channel(c).assignments[1].job.epoch, 2);
  EXPECT_EQ(Channel(c).assignments[1].rank, 1);
  EXPECT_THAT(Channel(a).stops, IsEmpty());
  // The old epoch is refused; the new one negotiates.
  EXPECT_EQ(Submit(c, id, 2, {Allreduce("g")}).code(), absl::StatusCode::kAborted);
  ASSERT_TRUE(Submit(a, id, 0, {Allreduce("g")}, {}, 2).ok());
  ASSERT_TRUE(Submit(c, id, 1, {Allreduce("g")}, {}, 2).ok());
  RunFor(absl::Milliseconds(10), {a, c});
  ASSERT_THAT(Channel(c).deliveries, Not(IsEmpty()));
  EXPECT_THAT(Describe(Channel(c).deliveries.back().cycle->output),
              ElementsAre("allreduce [] ids [1] sizes [4]"));  // a fresh negotiator's first id
}

TEST_F(CoordinatorTest, AFailedProcessLeavesItsSlotToANewOneAndTheResetLimitEndsIt) {
  const std::string a = Connect("host-a", "cpu");
  const std::string b = Connect("host-b", "cpu");
  const std::string id = coordinator_.RegisterJob(Elastic(2, 2, /*reset_limit=*/1))->id;
  ASSERT_TRUE(Update(a, id, 0, RankState::kStarted).ok());
  ASSERT_TRUE(Update(b, id, 1, RankState::kStarted).ok());
  ASSERT_TRUE(Update(b, id, 1, RankState::kExited, 1).ok());
  RunFor(absl::Milliseconds(300), {a, b}, absl::Milliseconds(100));
  Job job = GetJob(id);
  ASSERT_EQ(job.epoch, 2);
  ASSERT_THAT(job.ranks, SizeIs(2));
  EXPECT_EQ(job.ranks[1].worker_id, b);  // the same slot, a new process
  EXPECT_EQ(job.ranks[1].state, RankState::kAssigned);
  EXPECT_EQ(job.events.back().message,
            absl::StrCat("epoch 2: 2 ranks (1 kept, 1 added); gone: rank 1 on host host-b (", b,
                         "); because rank 1 on host host-b (", b, ") exited with status 1"));
  ASSERT_THAT(Channel(b).assignments, SizeIs(2));
  EXPECT_EQ(Channel(b).assignments[1].job.epoch, 2);

  // A second reset is past the limit of 1.
  ASSERT_TRUE(coordinator_.ResetRank(a, id, 2, 0, "a collective failed").ok());
  EXPECT_EQ(coordinator_.ResetRank(a, id, 1, 0, "stale").code(), absl::StatusCode::kAborted);
  RunFor(absl::Milliseconds(300), {a, b}, absl::Milliseconds(100));
  job = GetJob(id);
  EXPECT_EQ(job.state, JobState::kFailed);
  EXPECT_EQ(job.reason,
            absl::StrCat("reset limit 1 reached (--reset-limit): epoch 2 ended: rank 0 on host "
                         "host-a (",
                         a, ") reset: a collective failed"));
}

TEST_F(CoordinatorTest, BelowMinTheJobWaitsForWorkersThenFailsAtItsElasticTimeout) {
  const std::string a = Connect("host-a", "cpu");
  const std::string b = Connect("host-b", "cpu");
  const std::string id = coordinator_.RegisterJob(Elastic(2, 2, 0, /*timeout=*/30))->id;
  ASSERT_TRUE(Update(a, id, 0, RankState::kStarted).ok());
  ASSERT_TRUE(Update(b, id, 1, RankState::kStarted).ok());
  coordinator_.CloseSession(b, &Channel(b));  // b's daemon died; a's rank resets
  ASSERT_TRUE(coordinator_.ResetRank(a, id, 1, 0, "its peer went away").ok());
  RunFor(absl::Milliseconds(300), {a}, absl::Milliseconds(100));
  EXPECT_EQ(GetJob(id).epoch, 1);
  EXPECT_THAT(Channel(a).stopped_epochs,
              ElementsAre(absl::StrCat(id, "@1: rank 0 on host host-a (", a,
                                       ") reset: its peer went away")));
  EXPECT_EQ(GetJob(id).events.back().message,
            absl::StrCat("epoch 1 ended (rank 0 on host host-a (", a,
                         ") reset: its peer went away); 1 ranks left, fewer than min_np 2: "
                         "waiting up to 30 s for workers"));
  // A worker that comes within the timeout makes the next epoch.
  RunFor(absl::Seconds(5), {a}, absl::Milliseconds(500));
  const std::string c = Connect("host-c", "cpu");
  RunFor(absl::Milliseconds(200), {a, c}, absl::Milliseconds(100));
  Job job = GetJob(id);
  ASSERT_EQ(job.epoch, 2);
  EXPECT_EQ(job.ranks[0].worker_id, a);
  EXPECT_EQ(job.ranks[1].worker_id, c);

  // c's daemon dies too: 1 rank left, and no worker comes for 30 s.
  coordinator_.CloseSession(c, &Channel(c));
  ASSERT_TRUE(coordinator_.ResetRank(a, id, 2, 0, "its peer went away").ok());
  RunFor(absl::Seconds(29), {a}, absl::Milliseconds(500));
  EXPECT_EQ(GetJob(id).state, JobState::kRunning);
  RunFor(absl::Seconds(2), {a}, absl::Milliseconds(500));
  job = GetJob(id);
  EXPECT_EQ(job.state, JobState::kFailed);
  EXPECT_EQ(job.reason,
            "elastic job had 1 rank for 30 s (--elastic-timeout), fewer than min_np 2 (--min-np)");
}

TEST_F(CoordinatorTest, AFreeWorkerGrowsTheJobWhenItsRanksReset) {
  const std::string a = Connect("host-a", "cpu");
  const std::string b = Connect("host-b", "cpu");
  const std::string id = coordinator_.RegisterJob(Elastic(1, 3))->id;
  ASSERT_TRUE(Update(a, id, 0, RankState::kStarted).ok());
  ASSERT_TRUE(Update(b, id, 1, RankState::kStarted).ok());
  const std::string c = Connect("host-c", "cpu");
  RunFor(absl::Milliseconds(200), {a, b, c}, absl::Milliseconds(100));
  EXPECT_THAT(Channel(a).hosts_updated, ElementsAre(absl::StrCat(id, "@1")));
  EXPECT_THAT(Channel(b).hosts_updated, ElementsAre(absl::StrCat(id, "@1")));
  EXPECT_EQ(GetJob(id).epoch, 1);
  // The ranks reset at their next commit.
  ASSERT_TRUE(coordinator_.ResetRank(a, id, 1, 0, "hosts updated").ok());
  ASSERT_TRUE(coordinator_.ResetRank(b, id, 1, 1, "hosts updated").ok());
  RunFor(absl::Milliseconds(300), {a, b, c}, absl::Milliseconds(100));
  Job job = GetJob(id);
  ASSERT_EQ(job.epoch, 2);
  ASSERT_THAT(job.ranks, SizeIs(3));
  EXPECT_EQ(job.ranks[2].worker_id, c);
  EXPECT_EQ(job.events.back().message,
            absl::StrCat("epoch 2: 3 ranks (2 kept, 1 added); because rank 0 on host host-a (", a,
                         ") reset: hosts updated"));
  ASSERT_THAT(Channel(c).assignments, SizeIs(1));
  EXPECT_EQ(Channel(c).assignments[0].rank, 2);
}

// ---- Request batches ----

TEST_F(CoordinatorTest, BatchesAreCheckedAgainstTheAssignmentAndEpoch) {
  const std::string w1 = Connect("host-a", "cuda:0");
  const std::string w2 = Connect("host-a", "cuda:1");
  const std::string id = coordinator_.RegisterJob(Spec(2))->id;
  const std::string idle = Connect("host-b", "cuda:0");

  absl::Status s = Submit(idle, id, 0, {Allreduce("a")});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "worker worker-000003 is not assigned rank 0 of job job-000001");
  s = Submit(w1, id, 1, {Allreduce("a")});  // another worker's rank
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "worker worker-000001 is not assigned rank 1 of job job-000001");
  s = Submit(w1, id, 2, {Allreduce("a")});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "worker worker-000001 is not assigned rank 2 of job job-000001");
  s = Submit(w1, id, 0, {Allreduce("a")}, {}, /*epoch=*/0);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(s.message(), "epoch 0 of job job-000001 is stale; the job is at epoch 1");
  EXPECT_EQ(Submit(w1, id, 0, {Allreduce("a")}, {}, /*epoch=*/2).code(),
            absl::StatusCode::kAborted);
  s = Submit(w1, "job-000042", 0, {Allreduce("a")});
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "job 'job-000042' not found");
  EXPECT_EQ(Update(idle, id, 0, RankState::kStarted).code(), absl::StatusCode::kFailedPrecondition);

  // None of the refused batches reached the negotiator: "a" still needs both ranks.
  ASSERT_TRUE(Submit(w2, id, 1, {Allreduce("a")}).ok());
  EXPECT_THAT(Channel(w1).deliveries, IsEmpty());
  ASSERT_TRUE(Submit(w1, id, 0, {Allreduce("a")}).ok());
  EXPECT_THAT(Channel(w1).deliveries, SizeIs(1));
  EXPECT_THAT(Channel(w2).deliveries, SizeIs(1));
  EXPECT_THAT(Channel(idle).deliveries, IsEmpty());
}

TEST_F(CoordinatorTest, EveryRankReceivesTheSameResponsesInEveryCycle) {
  const std::string w0 = Connect("host-a", "cuda:0");
  const std::string w1 = Connect("host-a", "cuda:1");
  const std::string w2 = Connect("host-a", "cuda:2");
  const std::vector<std::string> ranks = {w0, w1, w2};
  const std::string id = coordinator_.RegisterJob(Spec(3))->id;
  ASSERT_EQ(GetJob(id).ranks[2].worker_id, w2);

  // Cycle 1: b becomes ready while a still waits for rank 2, so b leaves after the 1 ms cycle.
  ASSERT_TRUE(Submit(w0, id, 0, {Allreduce("a"), Allreduce("b")}).ok());
  ASSERT_TRUE(Submit(w2, id, 2, {Allreduce("b")}).ok());
  ASSERT_TRUE(Submit(w1, id, 1, {Allreduce("b"), Allreduce("a")}).ok());
  EXPECT_THAT(Channel(w0).deliveries, IsEmpty());
  const absl::Time ready = clock_.Now();
  EXPECT_EQ(coordinator_.NextDeadline(), ready + absl::Milliseconds(1));
  clock_.Advance(absl::Microseconds(999));
  coordinator_.Tick();
  EXPECT_THAT(Channel(w0).deliveries, IsEmpty());
  clock_.Advance(absl::Microseconds(1));
  coordinator_.Tick();
  std::vector<std::shared_ptr<CycleBroadcast>> cycles = SameCycles(ranks);
  ASSERT_THAT(cycles, SizeIs(1));
  EXPECT_EQ(cycles[0]->job_id, id);
  EXPECT_EQ(cycles[0]->fusion_threshold_bytes, int64_t{128} << 20);
  EXPECT_EQ(cycles[0]->cycle_time_ms, 1.0);
  EXPECT_THAT(Describe(cycles[0]->output), ElementsAre("allreduce [] ids [1] sizes [4]"));
  ASSERT_THAT(cycles[0]->output.cache_assignments, SizeIs(1));
  EXPECT_EQ(cycles[0]->output.cache_assignments[0].name, "b");
  EXPECT_EQ(cycles[0]->output.cache_assignments[0].id, 1u);

  // Cycle 2: the last rank submits a; nothing is partial, so it leaves at once.
  ASSERT_TRUE(Submit(w2, id, 2, {Allreduce("a")}).ok());
  cycles = SameCycles(ranks);
  ASSERT_THAT(cycles, SizeIs(2));
  EXPECT_THAT(Describe(cycles[1]->output), ElementsAre("allreduce [] ids [2] sizes [4]"));
  EXPECT_EQ(cycles[1]->output.cache_assignments[0].name, "a");

  // Cycle 3: steady state by cache id, in different orders; the last rank's order decides.
  ASSERT_TRUE(Submit(w0, id, 0, {}, {1, 2}).ok());
  ASSERT_TRUE(Submit(w1, id, 1, {}, {1, 2}).ok());
  ASSERT_TRUE(Submit(w2, id, 2, {}, {2, 1}).ok());
  cycles = SameCycles(ranks);
  ASSERT_THAT(cycles, SizeIs(3));
  EXPECT_THAT(Describe(cycles[2]->output), ElementsAre("allreduce [,] ids [2,1] sizes [4,4]"));
  EXPECT_THAT(cycles[2]->output.cache_assignments, IsEmpty());

  // Cycle 4: a shape mismatch fails the tensor on every rank with one message.
  ASSERT_TRUE(Submit(w0, id, 0, {Allreduce("c", {4})}).ok());
  ASSERT_TRUE(Submit(w1, id, 1, {Allreduce("c", {5})}).ok());
  ASSERT_TRUE(Submit(w2, id, 2, {Allreduce("c", {4})}).ok());
  cycles = SameCycles(ranks);
  ASSERT_THAT(cycles, SizeIs(4));
  EXPECT_THAT(Describe(cycles[3]->output),
              ElementsAre("error [c] ids [0] sizes [] error: Mismatched allreduce tensor shapes "
                          "for tensor 'c': rank 0 (host-a) sent [4] but rank 1 (host-a) sent "
                          "[5]."));

  // Cycle 5: a rank's own mistake reaches everyone's stream but only its own notice.
  ASSERT_TRUE(Submit(w1, id, 1, {Allreduce("")}).ok());
  cycles = SameCycles(ranks);
  ASSERT_THAT(cycles, SizeIs(5));
  const CycleOutput& out = cycles[4]->output;
  EXPECT_THAT(out.responses, IsEmpty());
  ASSERT_THAT(out.notices, SizeIs(3));
  EXPECT_TRUE(out.notices[0].empty());
  EXPECT_TRUE(out.notices[2].empty());
  ASSERT_THAT(out.notices[1].errors, SizeIs(1));
  EXPECT_EQ(out.notices[1].errors[0].error_message,
            "Invalid allreduce request for tensor '' from rank 1 (host-a): name is empty.");
}

// ---- Stalls ----

TEST_F(CoordinatorTest, StallReportIsAJobEventAndStallShutdownFailsTheJob) {
  const std::string w0 = Connect("host-a", "cuda:0");
  const std::string w1 = Connect("host-b", "cuda:0");
  JobSpec spec = Spec(2);
  spec.knobs.stall_check_seconds = 10;
  spec.knobs.stall_shutdown_seconds = 30;
  const std::string id = coordinator_.RegisterJob(spec)->id;
  ASSERT_EQ(GetJob(id).ranks[1].host, "host-b");
  ASSERT_TRUE(Update(w0, id, 0, RankState::kStarted).ok());
  ASSERT_TRUE(Update(w1, id, 1, RankState::kStarted).ok());
  ASSERT_TRUE(Submit(w0, id, 0, {Allreduce("x")}).ok());
  const size_t events_before = GetJob(id).events.size();

  auto stall = [](const std::string& waited) {
    return absl::StrCat(
        "Stalled collectives in job job-000001: tensors submitted by some ranks have waited ",
        waited, " for the others (rank 1 (host-b) has not submitted 'x').");
  };

  RunFor(absl::Seconds(5), {w0, w1});
  EXPECT_EQ(GetJob(id).events.size(), events_before);
  RunFor(absl::Seconds(5), {w0, w1});  // 10 s
  Job job = GetJob(id);
  ASSERT_EQ(job.events.size(), events_before + 1);
  EXPECT_EQ(job.events.back().message, stall("10s"));
  EXPECT_EQ(job.events.back().state, JobState::kRunning);
  EXPECT_EQ(job.state, JobState::kRunning);

  RunFor(absl::Seconds(5), {w0, w1});  // 15 s: reported once per period
  EXPECT_EQ(GetJob(id).events.size(), events_before + 1);
  RunFor(absl::Seconds(5), {w0, w1});  // 20 s
  EXPECT_EQ(GetJob(id).events.back().message, stall("20s"));
  EXPECT_EQ(GetJob(id).state, JobState::kRunning);

  RunFor(absl::Seconds(10), {w0, w1});  // 30 s
  job = GetJob(id);
  const std::string reason =
      absl::StrCat(stall("30s"), " Stall shutdown time exceeded: failing the job.");
  EXPECT_EQ(job.state, JobState::kFailed);
  EXPECT_EQ(job.reason, reason);
  EXPECT_THAT(Channel(w0).stops, ElementsAre(RecordingChannel::Stop{id, reason}));
  EXPECT_THAT(Channel(w1).stops, ElementsAre(RecordingChannel::Stop{id, reason}));
  EXPECT_EQ(GetWorker(w0).state, WorkerState::kIdle);
}

// ---- Output (logs) ----

std::vector<std::string> Texts(const LogRead& read) {
  std::vector<std::string> out;
  for (const LogChunk& c : read.chunks) out.push_back(absl::StrCat(c.rank, ":", c.data));
  return out;
}

TEST_F(CoordinatorTest, OutputIsCheckedLikeBatchesAndKeptAfterTheJobEnds) {
  const std::string w1 = Connect("host-a", "cpu");
  const std::string w2 = Connect("host-b", "cpu");
  const std::string id = coordinator_.RegisterJob(Spec(2))->id;
  const std::string idle = Connect("host-c", "cpu");
  auto say = [&](const std::string& w, int rank, std::string data, int64_t epoch = 1) {
    return coordinator_.AppendOutput(w, id, epoch, rank, OutputStream::kStdout, std::move(data));
  };
  absl::Status s = say(idle, 0, "forged");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "worker worker-000003 is not assigned rank 0 of job job-000001");
  EXPECT_EQ(say(w1, 1, "forged").code(), absl::StatusCode::kFailedPrecondition);
  s = say(w1, 0, "stale", /*epoch=*/2);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(s.message(), "epoch 2 of job job-000001 is stale; the job is at epoch 1");
  s = say(w1, 0, std::string(kMaxOutputMessageBytes + 1, 'x'));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "output.data of rank 0 of job job-000001 is 1048577 bytes; at most "
            "1048576 per message");
  ASSERT_TRUE(say(w1, 0, "a").ok());
  ASSERT_TRUE(say(w2, 1, "b").ok());
  EXPECT_THAT(Texts(coordinator_.ReadLogs(id, LogStore::kAllRanks, 0, 1 << 20)),
              ElementsAre("0:a", "1:b"));

  // A follower is woken when the job's log ends: at once when every rank had exited, else when the
  // ranks stopped at the end have reported their exit (their output comes first) or after the
  // linger (7 s), during which their last words are still taken.
  int wakes = 0;
  absl::StatusOr<int64_t> follow = coordinator_.FollowLogs(id, [&] { ++wakes; });
  ASSERT_TRUE(follow.ok());
  ASSERT_TRUE(Update(w2, id, 1, RankState::kExited, 3).ok());
  clock_.Advance(absl::Milliseconds(300));  // the failure settles
  coordinator_.Tick();
  EXPECT_EQ(GetJob(id).state, JobState::kFailed);
  EXPECT_EQ(wakes, 0);
  ASSERT_TRUE(say(w1, 0, "last words").ok());
  EXPECT_EQ(wakes, 1);
  EXPECT_FALSE(coordinator_.ReadLogs(id, LogStore::kAllRanks, 0, 1 << 20).end);
  // Only from the worker that served the rank, at the job's epoch.
  EXPECT_EQ(say(idle, 0, "forged").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(say(w2, 0, "forged").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(say(w1, 0, "stale", /*epoch=*/2).code(), absl::StatusCode::kFailedPrecondition);

  RunFor(absl::Milliseconds(1900), {w1, w2}, absl::Milliseconds(100));
  EXPECT_EQ(wakes, 1);
  // Only the worker that served the stopped rank speaks for its exit.
  EXPECT_FALSE(Update(w2, id, 0, RankState::kExited, 143).ok());
  EXPECT_EQ(wakes, 1);
  ASSERT_TRUE(Update(w1, id, 0, RankState::kExited, 143).ok());
  EXPECT_EQ(wakes, 2);
  LogRead read = coordinator_.ReadLogs(id, LogStore::kAllRanks, 0, 1 << 20);
  EXPECT_TRUE(read.end);
  EXPECT_THAT(Texts(read), ElementsAre("0:a", "1:b", "0:last words"));
  s = say(w1, 0, "too late");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "job job-000001 has ended; output of rank 0 is not accepted");
  coordinator_.UnfollowLogs(id, *follow);
  // The logs stay readable.
  EXPECT_TRUE(coordinator_.ReadLogs(id, 1, 0, 1 << 20).end);
  EXPECT_EQ(coordinator_.LogHead(id), 3);
}

TEST_F(CoordinatorTest, NoticeLinesOfARanksOutputBecomeJobEventsOnceAndBounded) {
  const std::string w1 = Connect("host-a", "cpu");
  const std::string id = coordinator_.RegisterJob(Spec(1))->id;
  auto say = [&](std::string data) {
    return coordinator_.AppendOutput(w1, id, 1, 0, OutputStream::kStderr, std::move(data));
  };
  auto notices = [&] {
    std::vector<std::string> out;
    for (const JobEvent& e : GetJob(id).events) {
      if (absl::StartsWith(e.message, "rank 0: ")) out.push_back(e.message);
    }
    return out;
  };
  ASSERT_TRUE(say("plain output\nringmaster-notice: framework 1.6 asked, 1.9 here\nmore\n").ok());
  ASSERT_TRUE(say("ringmaster-notice: framework 1.6 asked, 1.9 here\n").ok());  // again: once
  ASSERT_TRUE(say("not at the start: ringmaster-notice: x\nringmaster-notice:    \n").ok());
  ASSERT_TRUE(say("ringmaster-notice: " + std::string(600, 'y') + "\n").ok());
  EXPECT_THAT(notices(), ElementsAre("rank 0: framework 1.6 asked, 1.9 here",
                                     "rank 0: " + std::string(512, 'y') + "..."));
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(say(absl::StrCat("ringmaster-notice: n", i, "\n")).ok());
  EXPECT_EQ(notices().size(), 16u);  // at most 16 per job
  // The lines stay in the rank's output too.
  EXPECT_EQ(Texts(coordinator_.ReadLogs(id, LogStore::kAllRanks, 0, 1 << 20))[0],
            "0:plain output\nringmaster-notice: framework 1.6 asked, 1.9 here\nmore\n");
}

TEST_F(CoordinatorTest, TheLogOfAJobWhoseRanksAllExitedEndsAtOnce) {
  const std::string w1 = Connect("host-a", "cpu");
  const std::string id = coordinator_.RegisterJob(Spec(1))->id;
  ASSERT_TRUE(coordinator_.AppendOutput(w1, id, 1, 0, OutputStream::kStderr, "done\n").ok());
  ASSERT_TRUE(Update(w1, id, 0, RankState::kExited, 0).ok());
  EXPECT_EQ(GetJob(id).state, JobState::kSucceeded);
  LogRead read = coordinator_.ReadLogs(id, LogStore::kAllRanks, 0, 1 << 20);
  EXPECT_TRUE(read.end);
  ASSERT_EQ(read.chunks.size(), 1u);
  EXPECT_EQ(read.chunks[0].stream, OutputStream::kStderr);
  EXPECT_EQ(coordinator_.AppendOutput(w1, id, 1, 0, OutputStream::kStdout, "x").code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(CoordinatorTest, LogQueriesNameTheJobAndTheRankRange) {
  const std::string id = coordinator_.RegisterJob(Spec(4))->id;
  EXPECT_TRUE(coordinator_.CheckLogQuery(id, LogStore::kAllRanks).ok());
  EXPECT_TRUE(coordinator_.CheckLogQuery(id, 3).ok());
  absl::Status s = coordinator_.CheckLogQuery(id, 4);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "rank = 4 is out of bounds [0, 3] of job job-000001");
  EXPECT_EQ(coordinator_.CheckLogQuery(id, -2).code(), absl::StatusCode::kInvalidArgument);
  s = coordinator_.CheckLogQuery("job-000042", 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "job 'job-000042' not found");
  EXPECT_EQ(coordinator_.FollowLogs("job-000042", [] {}).status().code(),
            absl::StatusCode::kNotFound);
  // A job cancelled while pending has an empty log that has ended.
  ASSERT_TRUE(coordinator_.CancelJob(id, "").ok());
  LogRead read = coordinator_.ReadLogs(id, LogStore::kAllRanks, 0, 1 << 20);
  EXPECT_THAT(read.chunks, IsEmpty());
  EXPECT_TRUE(read.end);
}

// ---- Rendezvous ----

TEST_F(CoordinatorTest, RendezvousIsScopedByJobAndEpoch) {
  const std::string a0 = Connect("host-a", "cuda:0");
  const std::string a1 = Connect("host-a", "cuda:1");
  const std::string b0 = Connect("host-b", "cuda:0");
  const std::string job_a = coordinator_.RegisterJob(Spec(2))->id;
  const std::string job_b = coordinator_.RegisterJob(Spec(1))->id;
  ASSERT_EQ(GetJob(job_b).state, JobState::kStarting);

  ASSERT_TRUE(coordinator_.RendezvousSet(job_a, 1, "nccl_id", "abc").ok());
  EXPECT_EQ(coordinator_.RendezvousGet(job_a, 1, "nccl_id").value(), "abc");
  absl::StatusOr<std::string> other = coordinator_.RendezvousGet(job_b, 1, "nccl_id");
  EXPECT_EQ(other.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(other.status().message(), "key 'nccl_id' is not set");
  ASSERT_TRUE(coordinator_.RendezvousSet(job_b, 1, "nccl_id", "xyz").ok());
  EXPECT_EQ(coordinator_.RendezvousGet(job_a, 1, "nccl_id").value(), "abc");
  EXPECT_EQ(coordinator_.RendezvousGet(job_b, 1, "nccl_id").value(), "xyz");

  absl::StatusOr<std::string> stale = coordinator_.RendezvousGet(job_a, 0, "nccl_id");
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(stale.status().message(), "epoch 0 of job job-000001 is stale; the job is at epoch 1");
  EXPECT_EQ(coordinator_.RendezvousSet(job_a, 2, "k", "v").code(), absl::StatusCode::kAborted);
  absl::StatusOr<std::string> unknown = coordinator_.RendezvousGet("job-000042", 1, "k");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);

  // Wait answers when the last key arrives.
  std::optional<absl::StatusOr<std::vector<std::string>>> all;
  coordinator_.RendezvousWait(job_a, 1, {"r0", "r1"}, absl::Seconds(5),
                              [&](absl::StatusOr<std::vector<std::string>> r) { all = r; });
  EXPECT_FALSE(all.has_value());
  ASSERT_TRUE(coordinator_.RendezvousSet(job_a, 1, "r1", "one").ok());
  EXPECT_FALSE(all.has_value());
  ASSERT_TRUE(coordinator_.RendezvousSet(job_a, 1, "r0", "zero").ok());
  ASSERT_TRUE(all.has_value());
  ASSERT_TRUE(all->ok());
  EXPECT_THAT(**all, ElementsAre("zero", "one"));

  // Wait times out on Tick once its deadline passes.
  std::optional<absl::StatusOr<std::vector<std::string>>> late;
  coordinator_.RendezvousWait(job_a, 1, {"r0", "late"}, absl::Seconds(5),
                              [&](absl::StatusOr<std::vector<std::string>> r) { late = r; });
  RunFor(absl::Seconds(5) - absl::Milliseconds(200), {a0, a1, b0}, absl::Milliseconds(200));
  EXPECT_FALSE(late.has_value());
  RunFor(absl::Milliseconds(200), {a0, a1, b0});
  ASSERT_TRUE(late.has_value());
  EXPECT_EQ(late->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(late->status().message(), "rendezvous wait timed out; keys not set: late");

  // Bad timeouts.
  std::optional<absl::Status> bad;
  coordinator_.RendezvousWait(
      job_a, 1, {"k"}, absl::ZeroDuration(),
      [&](absl::StatusOr<std::vector<std::string>> r) { bad = r.status(); });
  ASSERT_TRUE(bad.has_value());
  EXPECT_EQ(bad->code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad->message(), "timeout_ms = 0 is out of bounds [1, 600000]");
  coordinator_.RendezvousWait(
      job_a, 1, {"k"}, absl::Minutes(11),
      [&](absl::StatusOr<std::vector<std::string>> r) { bad = r.status(); });
  EXPECT_EQ(bad->message(), "timeout_ms = 660000 is out of bounds [1, 600000]");

  // The job ending closes its scope: waiters abort, and later calls are refused.
  std::optional<absl::StatusOr<std::vector<std::string>>> aborted;
  coordinator_.RendezvousWait(job_a, 1, {"never"}, absl::Seconds(60),
                              [&](absl::StatusOr<std::vector<std::string>> r) { aborted = r; });
  ASSERT_TRUE(coordinator_.CancelJob(job_a, "").ok());
  ASSERT_TRUE(aborted.has_value());
  EXPECT_EQ(aborted->status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(aborted->status().message(), "job job-000001 ended: cancelled by user");
  absl::StatusOr<std::string> closed = coordinator_.RendezvousGet(job_a, 1, "nccl_id");
  EXPECT_EQ(closed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(closed.status().message(), "job job-000001 is CANCELLED; its rendezvous is closed");
  EXPECT_EQ(coordinator_.RendezvousGet(job_b, 1, "nccl_id").value(), "xyz");

  // A job that has not started has no rendezvous yet.
  const std::string pending = coordinator_.RegisterJob(Spec(3))->id;
  ASSERT_EQ(GetJob(pending).state, JobState::kPending);
  absl::Status not_started = coordinator_.RendezvousSet(pending, 0, "k", "v");
  EXPECT_EQ(not_started.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(not_started.message(), "job job-000003 is PENDING; its rendezvous is closed");
}

// ---- Sessions ----

TEST_F(CoordinatorTest, ReconnectingWorkerGetsItsAssignmentAgainAndTheOldSessionIsClosed) {
  const std::string w0 = Connect("host-a", "cuda:0");
  const std::string w1 = Connect("host-a", "cuda:1");
  const std::string id = coordinator_.RegisterJob(Spec(2))->id;

  RecordingChannel newer;
  ASSERT_TRUE(coordinator_.OpenSession(w1, &newer).ok());
  ASSERT_THAT(Channel(w1).closes, SizeIs(1));
  EXPECT_EQ(Channel(w1).closes[0].code(), absl::StatusCode::kAborted);
  EXPECT_EQ(Channel(w1).closes[0].message(), "superseded by a newer session of the same worker");
  ASSERT_THAT(newer.assignments, SizeIs(1));
  EXPECT_EQ(newer.assignments[0].job.id, id);
  EXPECT_EQ(newer.assignments[0].rank, 1);

  // Closing the superseded session changes nothing; cycles go to the newer one.
  coordinator_.CloseSession(w1, &Channel(w1));
  ASSERT_TRUE(Submit(w0, id, 0, {Allreduce("a")}).ok());
  ASSERT_TRUE(Submit(w1, id, 1, {Allreduce("a")}).ok());
  EXPECT_THAT(newer.deliveries, SizeIs(1));
  EXPECT_THAT(Channel(w1).deliveries, IsEmpty());
  EXPECT_THAT(Channel(w0).deliveries, SizeIs(1));

  // Once closed, the worker gets nothing until it reconnects.
  coordinator_.CloseSession(w1, &newer);
  EXPECT_FALSE(GetWorker(w1).connected);
  ASSERT_TRUE(Submit(w0, id, 0, {Allreduce("b")}).ok());
  ASSERT_TRUE(Submit(w1, id, 1, {Allreduce("b")}).ok());
  EXPECT_THAT(newer.deliveries, SizeIs(1));
  EXPECT_THAT(Channel(w0).deliveries, SizeIs(2));

  RecordingChannel unknown;
  EXPECT_EQ(coordinator_.OpenSession("worker-000042", &unknown).code(),
            absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorTest, ARankResumedAfterASessionResetTakesTheLocksInAFlushsOrder) {
  // Abseil's lock-order graph aborts this process on a lock taken against an order it has seen. A
  // flush holds the job's runtime lock while it takes the coordinator's to deliver; resuming a rank
  // took them the other way round, which deadlocked a coordinator when a reset met a flush.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kAbort);
  const std::string w0 = Connect("host-a", "cpu");
  const std::string w1 = Connect("host-a", "cpu");
  const std::string id = coordinator_.RegisterJob(Spec(2))->id;
  for (const auto& [worker, rank] : {std::pair{w0, 0}, std::pair{w1, 1}}) {
    RequestBatch batch;
    batch.job_id = id;
    batch.epoch = 1;
    batch.rank = rank;
    batch.seq = 1;
    batch.requests = {Allreduce("a")};
    ASSERT_TRUE(coordinator_.SubmitRequests(worker, std::move(batch)).ok());
  }
  ASSERT_THAT(Channel(w1).deliveries, SizeIs(1));

  // Rank 1's session resets before it received the list: its new session gets the list again,
  // then word that the coordinator has its batch 1.
  RecordingChannel newer;
  ASSERT_TRUE(coordinator_.OpenSession(w1, &newer).ok());
  RankResume resume;
  resume.job_id = id;
  resume.epoch = 1;
  resume.rank = 1;
  resume.last_response_seq = 0;
  coordinator_.ResumeRanks(w1, &newer, {resume});
  ASSERT_THAT(newer.deliveries, SizeIs(1));
  EXPECT_EQ(newer.deliveries[0].cycle.get(), Channel(w1).deliveries[0].cycle.get());
  EXPECT_EQ(newer.deliveries[0].rank, 1);
  EXPECT_THAT(newer.resumed, ElementsAre(absl::StrCat(id, "@1 rank 1 has 1")));
}

// ---- Negotiation relays ----

std::vector<RequestBatch> Batches(const std::string& job_id, std::vector<int> ranks, uint64_t seq,
                                  const std::vector<TensorRequest>& requests) {
  std::vector<RequestBatch> out;
  for (int rank : ranks) {
    RequestBatch& b = out.emplace_back();
    b.job_id = job_id;
    b.epoch = 1;
    b.rank = rank;
    b.seq = seq;
    b.requests = requests;
  }
  return out;
}

TEST_F(CoordinatorTest, ARelayCarriesItsHostsBatchesAndGetsOneListForThemUntilARankGoesDirect) {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kAbort);
  std::vector<std::string> w;
  const std::string id = TwoHostJob(&w);
  const std::string &w0 = w[0], &w1 = w[1], &w2 = w[2], &w3 = w[3];

  // Each host's relay sends its ranks' batches in one message; each gets one list for them.
  ASSERT_TRUE(coordinator_.SubmitRelayed(w0, Batches(id, {0, 1}, 1, {Allreduce("a")})).ok());
  EXPECT_THAT(Channel(w0).relayed, IsEmpty());
  ASSERT_TRUE(coordinator_.SubmitRelayed(w2, Batches(id, {2, 3}, 1, {Allreduce("a")})).ok());
  ASSERT_THAT(Channel(w0).relayed, SizeIs(1));
  ASSERT_THAT(Channel(w2).relayed, SizeIs(1));
  EXPECT_THAT(Channel(w0).relayed[0].ranks, ElementsAre(0, 1));
  EXPECT_THAT(Channel(w2).relayed[0].ranks, ElementsAre(2, 3));
  EXPECT_EQ(Channel(w0).relayed[0].cycle.get(), Channel(w2).relayed[0].cycle.get());
  EXPECT_THAT(Describe(Channel(w0).relayed[0].cycle->output),
              ElementsAre("allreduce [] ids [1] sizes [4]"));
  for (const std::string& w : {w0, w1, w2, w3}) EXPECT_THAT(Channel(w).deliveries, IsEmpty()) << w;

  // A relay may carry only its own host's ranks: another host's batch is refused, naming both
  // hosts, and taken nowhere (rank 2's own batch 2 is still to come, and counts). Nor may a
  // daemon of the host that is not its relay carry its host's ranks.
  absl::Status refused = coordinator_.SubmitRelayed(w0, Batches(id, {2}, 2, {Allreduce("x")}));
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(refused.message(),
            absl::StrCat("relay ", w0, " (rank 0, host host-a) may not relay rank 2 of job ", id,
                         ", whose worker is on host host-b and relayed by rank 2"));
  refused = coordinator_.SubmitRelayed(w1, Batches(id, {0}, 2, {Allreduce("x")}));
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(refused.message(),
            absl::StrCat("relay ", w1, " (rank 1, host host-a) may not relay rank 0 of job ", id,
                         ", whose worker is on host host-a and relayed by rank 0"));
  EXPECT_EQ(coordinator_.SubmitRelayed(w0, Batches("no-such-job", {0}, 2, {})).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(coordinator_.SubmitRelayed(w0, Batches(id, {7}, 2, {})).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(coordinator_.SubmitRelayed(w0, Batches(id, {0, 1}, 2, {Allreduce("b")})).ok());
  ASSERT_TRUE(coordinator_.SubmitRelayed(w2, Batches(id, {2, 3}, 2, {Allreduce("b")})).ok());
  ASSERT_THAT(Channel(w0).relayed, SizeIs(2));
  EXPECT_THAT(Describe(Channel(w0).relayed[1].cycle->output),
              ElementsAre("allreduce [] ids [2] sizes [4]"));

  // Rank 1 resumes on a session of its own (its relay's link broke): it gets no list again (it
  // has both) and its lists come to it directly from then on, even when a batch of it still
  // arrives through the relay late.
  RecordingChannel own;
  ASSERT_TRUE(coordinator_.OpenSession(w1, &own).ok());
  RankResume resume;
  resume.job_id = id;
  resume.epoch = 1;
  resume.rank = 1;
  resume.last_response_seq = 2;
  coordinator_.ResumeRanks(w1, &own, {resume});
  EXPECT_THAT(own.deliveries, IsEmpty());
  EXPECT_THAT(own.resumed, ElementsAre(absl::StrCat(id, "@1 rank 1 has 2")));
  ASSERT_TRUE(coordinator_.SubmitRelayed(w0, Batches(id, {0, 1}, 3, {Allreduce("c")})).ok());
  ASSERT_TRUE(coordinator_.SubmitRelayed(w2, Batches(id, {2, 3}, 3, {Allreduce("c")})).ok());
  ASSERT_THAT(Channel(w0).relayed, SizeIs(3));
  EXPECT_THAT(Channel(w0).relayed[2].ranks, ElementsAre(0));
  EXPECT_THAT(Channel(w2).relayed[2].ranks, ElementsAre(2, 3));
  ASSERT_THAT(own.deliveries, SizeIs(1));
  EXPECT_EQ(own.deliveries[0].rank, 1);
  EXPECT_EQ(own.deliveries[0].cycle.get(), Channel(w0).relayed[2].cycle.get());
  EXPECT_EQ(own.deliveries[0].cycle->seq, 3u);
}

TEST_F(CoordinatorTest, WithRelayHostsOneRelayCarriesItsGroupOfHostsAndGetsOneListForAll) {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kAbort);
  std::vector<std::string> w;
  const std::string id = TwoHostJob(&w, /*relay_hosts=*/2);
  const std::string &w0 = w[0], &w2 = w[2];

  // Host-b's own relay is not the group's: its batches are refused and taken nowhere.
  absl::Status refused = coordinator_.SubmitRelayed(w2, Batches(id, {2, 3}, 1, {Allreduce("a")}));
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(refused.message(),
            absl::StrCat("relay ", w2, " (rank 2, host host-b) may not relay rank 2 of job ", id,
                         ", whose worker is on host host-b and relayed by rank 0"));
  EXPECT_THAT(Channel(w2).relayed, IsEmpty());

  // Rank 0 relays both hosts' ranks: one message in, one list out for the four.
  ASSERT_TRUE(coordinator_.SubmitRelayed(w0, Batches(id, {0, 1, 2, 3}, 1, {Allreduce("a")})).ok());
  ASSERT_THAT(Channel(w0).relayed, SizeIs(1));
  EXPECT_THAT(Channel(w0).relayed[0].ranks, ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(Describe(Channel(w0).relayed[0].cycle->output),
              ElementsAre("allreduce [] ids [1] sizes [4]"));
  for (const std::string& worker : w) {
    EXPECT_THAT(Channel(worker).deliveries, IsEmpty()) << worker;
  }
  EXPECT_THAT(Channel(w2).relayed, IsEmpty());
}

TEST_F(CoordinatorTest, HostsOfAnotherIdentityAreRelayedByTheirOwnRelayWhateverTheRelayHosts) {
  std::vector<std::string> w;
  const std::string id = TwoHostJob(&w, /*relay_hosts=*/2, /*identity_b=*/"node-b");
  const std::string &w0 = w[0], &w2 = w[2];
  // A certificate per host: host-b's ranks are a group of their own, relayed by rank 2.
  absl::Status refused = coordinator_.SubmitRelayed(w0, Batches(id, {2}, 1, {Allreduce("a")}));
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(refused.message(),
            absl::StrCat("relay ", w0, " (rank 0, host host-a) may not relay rank 2 of job ", id,
                         ", whose worker is on host host-b under another identity"));
  ASSERT_TRUE(coordinator_.SubmitRelayed(w0, Batches(id, {0, 1}, 1, {Allreduce("a")})).ok());
  ASSERT_TRUE(coordinator_.SubmitRelayed(w2, Batches(id, {2, 3}, 1, {Allreduce("a")})).ok());
  ASSERT_THAT(Channel(w0).relayed, SizeIs(1));
  ASSERT_THAT(Channel(w2).relayed, SizeIs(1));
  EXPECT_THAT(Channel(w0).relayed[0].ranks, ElementsAre(0, 1));
  EXPECT_THAT(Channel(w2).relayed[0].ranks, ElementsAre(2, 3));
}

TEST_F(CoordinatorTest, ARelaysSharedCacheIdsCountForTheRanksWhoseBatchesItTookAlone) {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kAbort);
  std::vector<std::string> w;
  const std::string id = TwoHostJob(&w);
  const std::string &w0 = w[0], &w2 = w[2];

  // Step 1 in full: the list gives "a" and "b" their cache ids.
  ASSERT_TRUE(
      coordinator_.SubmitRelayed(w0, Batches(id, {0, 1}, 1, {Allreduce("a"), Allreduce("b")}))
          .ok());
  ASSERT_TRUE(
      coordinator_.SubmitRelayed(w2, Batches(id, {2, 3}, 1, {Allreduce("a"), Allreduce("b")}))
          .ok());
  ASSERT_THAT(Channel(w0).relayed, SizeIs(1));
  uint32_t a = 0, b = 0;
  for (const CacheAssignment& c : Channel(w0).relayed[0].cycle->output.cache_assignments) {
    (c.name == "a" ? a : b) = c.id;
  }
  ASSERT_NE(a, 0u);
  ASSERT_NE(b, 0u);

  // Step 2 by id: host-a's relay sends both ids once for its two ranks, host-b's relay in each
  // batch. One list answers them all, as if every batch had held both ids.
  ASSERT_TRUE(coordinator_.SubmitRelayed(w0, Batches(id, {0, 1}, 2, {}), {a, b}).ok());
  EXPECT_THAT(Channel(w0).relayed, SizeIs(1));
  std::vector<RequestBatch> host_b = Batches(id, {2, 3}, 2, {});
  for (RequestBatch& batch : host_b) batch.cached_ids = {a, b};
  ASSERT_TRUE(coordinator_.SubmitRelayed(w2, std::move(host_b)).ok());
  ASSERT_THAT(Channel(w0).relayed, SizeIs(2));
  const CycleOutput& step2 = Channel(w0).relayed[1].cycle->output;
  EXPECT_THAT(Describe(step2),
              ElementsAre(absl::StrCat("allreduce [,] ids [", a, ",", b, "] sizes [4,4]")));
  for (const RankNotice& n : step2.notices) {
    EXPECT_TRUE(n.resend_ids.empty());
    EXPECT_TRUE(n.errors.empty());
  }

  // Step 3. Host-a's relay sends batch 2 of ranks 0 and 1 again (a resend after a reconnect)
  // with "a" shared, and rank 2's batch 3, which it may not carry: none of those batches is
  // taken, so neither is their share of "a". Had it been, rank 2's own "a" below would be a
  // second submission (an error), and ranks 0 and 1 would have submitted "a" without a batch.
  std::vector<RequestBatch> stale = Batches(id, {0, 1}, 2, {});
  stale.push_back(Batches(id, {2}, 3, {})[0]);
  EXPECT_EQ(coordinator_.SubmitRelayed(w0, std::move(stale), {a}).code(),
            absl::StatusCode::kPermissionDenied);
  std::vector<RequestBatch> late = Batches(id, {2, 3}, 3, {});
  for (RequestBatch& batch : late) batch.cached_ids = {a};
  ASSERT_TRUE(coordinator_.SubmitRelayed(w2, std::move(late)).ok());
  EXPECT_THAT(Channel(w0).relayed, SizeIs(2));  // "a" waits for ranks 0 and 1
  ASSERT_TRUE(coordinator_.SubmitRelayed(w0, Batches(id, {0, 1}, 3, {}), {a}).ok());
  ASSERT_THAT(Channel(w0).relayed, SizeIs(3));
  const CycleOutput& step3 = Channel(w0).relayed[2].cycle->output;
  EXPECT_THAT(Describe(step3), ElementsAre(absl::StrCat("allreduce [] ids [", a, "] sizes [4]")));
  for (const RankNotice& n : step3.notices) {
    EXPECT_TRUE(n.resend_ids.empty());
    EXPECT_TRUE(n.errors.empty());
  }

  // An id the coordinator does not know: each rank that shared it is told to send it in full.
  ASSERT_TRUE(coordinator_.SubmitRelayed(w0, Batches(id, {0, 1}, 4, {}), {999}).ok());
  ASSERT_THAT(Channel(w0).relayed, SizeIs(4));
  const CycleOutput& step4 = Channel(w0).relayed[3].cycle->output;
  EXPECT_THAT(step4.responses, IsEmpty());
  ASSERT_THAT(step4.notices, SizeIs(4));
  EXPECT_THAT(step4.notices[0].resend_ids, ElementsAre(999u));
  EXPECT_THAT(step4.notices[1].resend_ids, ElementsAre(999u));
  EXPECT_THAT(step4.notices[2].resend_ids, IsEmpty());
  EXPECT_THAT(step4.notices[3].resend_ids, IsEmpty());

  // A batch's shared ids come before its full requests, as its own ids do: rank 1 joins in the
  // batch that shares "a", having submitted "a" first, so "a" is reduced with rank 1's data and
  // no error reaches rank 1 (a rank's requests after its join would be errors).
  std::vector<RequestBatch> joining = Batches(id, {0, 1}, 5, {});
  TensorRequest join;
  join.name = "join";
  join.type = RequestType::kJoin;
  joining[1].requests = {join};
  ASSERT_TRUE(coordinator_.SubmitRelayed(w0, std::move(joining), {a}).ok());
  std::vector<RequestBatch> others = Batches(id, {2, 3}, 4, {});
  for (RequestBatch& batch : others) batch.cached_ids = {a};
  ASSERT_TRUE(coordinator_.SubmitRelayed(w2, std::move(others)).ok());
  ASSERT_THAT(Channel(w0).relayed, SizeIs(5));
  const CycleOutput& step5 = Channel(w0).relayed[4].cycle->output;
  EXPECT_THAT(Describe(step5), ElementsAre(absl::StrCat("allreduce [] ids [", a, "] sizes [4]")));
  for (const RankNotice& n : step5.notices) {
    EXPECT_TRUE(n.resend_ids.empty());
    EXPECT_TRUE(n.errors.empty()) << Describe(n.errors[0]);
  }
}

TEST_F(CoordinatorTest, ShutdownEndsEverySessionUnavailableAndFailsRendezvousWaits) {
  const std::string w0 = Connect("host-a", "cuda:0");
  const std::string w1 = Connect("host-a", "cuda:1");
  const std::string id = coordinator_.RegisterJob(Spec(2))->id;
  std::optional<absl::Status> waited;
  coordinator_.RendezvousWait(
      id, 1, {"k"}, absl::Seconds(30),
      [&](absl::StatusOr<std::vector<std::string>> r) { waited = r.status(); });
  coordinator_.Shutdown("coordinator is shutting down");
  // No daemon is told to exit: an UNAVAILABLE session makes it reconnect.
  EXPECT_THAT(Channel(w0).shutdowns, IsEmpty());
  EXPECT_THAT(Channel(w1).shutdowns, IsEmpty());
  EXPECT_THAT(Channel(w0).closes,
              ElementsAre(absl::UnavailableError("coordinator is shutting down")));
  EXPECT_THAT(Channel(w1).closes,
              ElementsAre(absl::UnavailableError("coordinator is shutting down")));
  ASSERT_TRUE(waited.has_value());
  EXPECT_EQ(waited->code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(waited->message(), "coordinator is shutting down");
}

}  // namespace
}  // namespace ringmaster

namespace ringmaster {
namespace {

TEST_F(CoordinatorTest, ARankFailingRightAfterAPeerDisconnectsNamesThePeer) {
  const std::string w0 = Connect("host-a", "cpu");
  const std::string w1 = Connect("host-b", "cpu");
  const std::string id = coordinator_.RegisterJob(Spec(2))->id;
  // Rank 0's collective lost its peer and it exits; a moment later rank 1's broken session shows.
  ASSERT_TRUE(Update(w0, id, 0, RankState::kExited, 1).ok());
  EXPECT_EQ(GetJob(id).state, JobState::kStarting);
  coordinator_.CloseSession(w1, &Channel(w1));
  EXPECT_EQ(GetJob(id).state, JobState::kFailed);
  EXPECT_EQ(GetJob(id).reason,
            "worker worker-000002 serving rank 1 on host host-b disconnected (its session "
            "broke); then rank 0 on host host-a (worker-000001) exited with status 1");
}

TEST_F(CoordinatorTest, GetJobReportsLiveThroughputOverTheLastTenSeconds) {
  const std::string w0 = Connect("host-a", "cpu");
  const std::string w1 = Connect("host-b", "cpu");
  const std::string id = coordinator_.RegisterJob(Spec(2))->id;
  EXPECT_FALSE(GetJob(id).throughput.has_value() && GetJob(id).throughput->bytes_per_second > 0);
  // Ten steps, one a second, each allreducing two float32 tensors of 250 elements: 2000 bytes.
  auto ten_steps = [&] {
    for (int step = 0; step < 10; ++step) {
      for (int rank : {0, 1}) {
        ASSERT_TRUE(
            Submit(rank == 0 ? w0 : w1, id, rank, {Allreduce("w", {250}), Allreduce("b", {250})})
                .ok());
      }
      clock_.Advance(absl::Seconds(1));
      for (const std::string& w : {w0, w1}) ASSERT_TRUE(coordinator_.Heartbeat(w).ok());
    }
  };
  ASSERT_NO_FATAL_FAILURE(ten_steps());
  Job job = GetJob(id);
  ASSERT_TRUE(job.throughput.has_value());
  const JobThroughput& t = *job.throughput;
  EXPECT_EQ(t.tensors_negotiated, 20);
  EXPECT_EQ(t.bytes_negotiated, 20000);
  // The window runs from the first step's snapshot to now: 9 more steps in 10 s.
  EXPECT_DOUBLE_EQ(t.bytes_per_second, 18000.0 / 10);
  EXPECT_DOUBLE_EQ(t.steps_per_second, 0.9);
  EXPECT_DOUBLE_EQ(t.cycles_per_second, 0.9);
  EXPECT_EQ(t.fusion_threshold_bytes, int64_t{128} << 20);
  EXPECT_EQ(t.cycle_time_ms, 1.0);
  // Nothing moves for 3 s: the live rates are 0, the totals stay.
  clock_.Advance(absl::Seconds(2));
  for (const std::string& w : {w0, w1}) ASSERT_TRUE(coordinator_.Heartbeat(w).ok());
  Job idle = GetJob(id);
  ASSERT_TRUE(idle.throughput.has_value());
  EXPECT_EQ(idle.throughput->bytes_per_second, 0);
  EXPECT_EQ(idle.throughput->steps_per_second, 0);
  EXPECT_EQ(idle.throughput->cycles_per_second, 0);
  EXPECT_EQ(idle.throughput->bytes_negotiated, 20000);
  // Steps resume, one a second: after 10 s, the window holds only them.
  ASSERT_NO_FATAL_FAILURE(ten_steps());
  EXPECT_DOUBLE_EQ(GetJob(id).throughput->bytes_per_second, 18000.0 / 10);
  // Once the job ends it keeps its figures as of its last cycle (21 s after the first), however
  // long ago that is: over the 12 s since the newest snapshot at least 10 s older (step 10 of the
  // first run, at 9 s), 10 steps of 2000 bytes.
  ASSERT_TRUE(coordinator_.CancelJob(id, "").ok());
  clock_.Advance(absl::Seconds(30));
  Job ended = GetJob(id);
  ASSERT_TRUE(ended.throughput.has_value());
  EXPECT_EQ(ended.throughput->tensors_negotiated, 40);
  EXPECT_EQ(ended.throughput->bytes_negotiated, 40000);
  EXPECT_DOUBLE_EQ(ended.throughput->bytes_per_second, 20000.0 / 12);
  EXPECT_DOUBLE_EQ(ended.throughput->steps_per_second, 10.0 / 12);
  EXPECT_DOUBLE_EQ(ended.throughput->cycles_per_second, 10.0 / 12);
  EXPECT_EQ(ended.throughput->fusion_threshold_bytes, int64_t{128} << 20);
}

TEST_F(CoordinatorTest, AJobThatNeverRanHasNoThroughput) {
  const std::string id = coordinator_.RegisterJob(Spec(2))->id;
  EXPECT_FALSE(GetJob(id).throughput.has_value());
  ASSERT_TRUE(coordinator_.CancelJob(id, "").ok());
  EXPECT_FALSE(GetJob(id).throughput.has_value());
}

TEST_F(CoordinatorTest, APendingJobSaysWhyItWaitsAndWatchersSeeEachChange) {
  const std::string id = coordinator_.RegisterJob(Spec(2))->id;
  EXPECT_EQ(GetJob(id).waiting_reason, "needs 2 idle cpu slots; 0 registered, 0 idle");
  const std::string w0 = Connect("host-a", "cpu");
  EXPECT_EQ(GetJob(id).waiting_reason, "needs 2 idle cpu slots; 1 registered, 1 idle");
  coordinator_.CloseSession(w0, &Channel(w0));
  EXPECT_EQ(GetJob(id).waiting_reason, "needs 2 idle cpu slots; 1 registered, 0 idle");
  std::vector<std::string> events;
  for (const JobEvent& e : GetJob(id).events) events.push_back(e.message);
  EXPECT_THAT(events, ElementsAre("registered: 2 ranks",
                                  "waiting: needs 2 idle cpu slots; 0 registered, 0 idle",
                                  "waiting: needs 2 idle cpu slots; 1 registered, 1 idle",
                                  "waiting: needs 2 idle cpu slots; 1 registered, 0 idle"));
  ASSERT_TRUE(coordinator_.OpenSession(w0, &Channel(w0)).ok());
  Connect("host-b", "cpu");
  EXPECT_EQ(GetJob(id).state, JobState::kStarting);
  EXPECT_EQ(GetJob(id).waiting_reason, "");
}

TEST_F(CoordinatorTest, AJobWhoseRanksDoNotAllStartFailsAtTheStartTimeoutNamingThem) {
  const std::string w0 = Connect("host-a", "cpu");
  const std::string w1 = Connect("host-b", "cpu");
  const std::string w2 = Connect("host-b", "cpu");
  const std::string id = coordinator_.RegisterJob(Spec(3))->id;
  ASSERT_TRUE(Update(w0, id, 0, RankState::kStarted).ok());
  clock_.Advance(absl::Minutes(5) - absl::Seconds(1));
  for (const std::string& w : {w0, w1, w2}) ASSERT_TRUE(coordinator_.Heartbeat(w).ok());
  coordinator_.Tick();
  EXPECT_EQ(GetJob(id).state, JobState::kStarting);
  clock_.Advance(absl::Seconds(1));
  for (const std::string& w : {w0, w1, w2}) ASSERT_TRUE(coordinator_.Heartbeat(w).ok());
  coordinator_.Tick();
  const Job job = GetJob(id);
  EXPECT_EQ(job.state, JobState::kFailed);
  EXPECT_EQ(job.reason,
            "2 ranks did not start within 5m: rank 1 on host host-b (worker-000002), rank 2 on "
            "host host-b (worker-000003)");
  EXPECT_THAT(Channel(w0).stops, SizeIs(1));
}

TEST_F(CoordinatorTest, AJobThatRunsIsNotFailedByTheStartTimeout) {
  const std::string w0 = Connect("host-a", "cpu");
  const std::string id = coordinator_.RegisterJob(Spec(1))->id;
  ASSERT_TRUE(Update(w0, id, 0, RankState::kStarted).ok());
  EXPECT_EQ(GetJob(id).state, JobState::kRunning);
  clock_.Advance(absl::Minutes(6));
  ASSERT_TRUE(coordinator_.Heartbeat(w0).ok());
  coordinator_.Tick();
  EXPECT_EQ(GetJob(id).state, JobState::kRunning);
}

TEST_F(CoordinatorTest, RanksThatHadNotExitedWhenTheJobEndedAreStopped) {
  const std::string w0 = Connect("host-a", "cpu");
  const std::string w1 = Connect("host-b", "cpu");
  const std::string id = coordinator_.RegisterJob(Spec(2))->id;
  ASSERT_TRUE(Update(w0, id, 0, RankState::kStarted, 0).ok());
  ASSERT_TRUE(Update(w1, id, 1, RankState::kStarted, 0).ok());
  ASSERT_TRUE(Update(w1, id, 1, RankState::kExited, 3).ok());
  clock_.Advance(absl::Seconds(1));
  coordinator_.Tick();
  Job job = GetJob(id);
  ASSERT_EQ(job.state, JobState::kFailed);
  EXPECT_EQ(job.ranks[0].state, RankState::kStopped);
  EXPECT_EQ(job.ranks[1].state, RankState::kExited);
  EXPECT_EQ(job.ranks[1].exit_code, 3);
}

// ---- Autotune and the timeline ----

TEST_F(CoordinatorTest, AutotuneChangesReachEveryRankAtTheSameCycleAndEndAtTheBest) {
  const std::string w0 = Connect("host-a", "cpu");
  const std::string w1 = Connect("host-b", "cpu");
  JobSpec spec = Spec(2);
  spec.knobs.autotune = true;
  spec.knobs.autotune_warmup_samples = 1;
  spec.knobs.autotune_steps_per_sample = 2;
  spec.knobs.autotune_bayes_opt_max_samples = 4;
  spec.knobs.autotune_log = "autotune.csv";
  spec.knobs.autotune_fixed = {"cycle_time_ms"};
  const std::string id = coordinator_.RegisterJob(spec)->id;
  for (int step = 0; step < 40; ++step) {
    for (int rank : {0, 1}) {
      ASSERT_TRUE(Submit(rank == 0 ? w0 : w1, id, rank, {Allreduce("w", {1000})}).ok());
    }
    clock_.Advance(absl::Milliseconds(100));
  }
  const std::vector<std::shared_ptr<CycleBroadcast>> cycles = SameCycles({w0, w1});
  // One cycle per step, plus one for each switch of the response cache off (its evictions).
  ASSERT_GE(cycles.size(), 40u);
  std::vector<int64_t> thresholds;
  for (const auto& c : cycles) {
    EXPECT_EQ(c->cycle_time_ms, 1.0);  // fixed: never moved
    if (thresholds.empty() || thresholds.back() != c->fusion_threshold_bytes) {
      thresholds.push_back(c->fusion_threshold_bytes);
    }
  }
  EXPECT_GT(thresholds.size(), 2u);  // the tuner did move the fusion threshold
  const Job job = GetJob(id);
  ASSERT_TRUE(job.throughput.has_value());
  ASSERT_TRUE(job.throughput->autotune.has_value());
  const AutotuneStatus& a = *job.throughput->autotune;
  EXPECT_EQ(a.phase, AutotunePhase::kDone);
  EXPECT_EQ(a.samples, 4);
  // Every sample moved 2 steps of 4000 bytes in 200 ms: the same score, 40000 bytes/s.
  EXPECT_NEAR(a.best_score, 40000, 1);
  EXPECT_EQ(job.throughput->fusion_threshold_bytes, a.best.fusion_threshold_bytes);
  const std::string log = ReadArtifact(id, "autotune.csv");
  std::vector<std::string> lines = absl::StrSplit(log, '\n', absl::SkipEmpty());
  ASSERT_THAT(lines, SizeIs(6));  // header, 4 samples, the best
  EXPECT_EQ(lines[0],
            "hierarchical_allreduce,hierarchical_allgather,cache_enabled,cycle_time_ms,"
            "tensor_fusion_threshold,score");
  // The starting setting comes first; the first two columns are the job's hierarchical knobs (by
  // default both on), which autotune leaves alone.
  EXPECT_EQ(lines[1], "1,1,1,1,128,40000");
}

TEST_F(CoordinatorTest, TheTimelineIsAnArtifactReadableAsValidJsonWhileTheJobRuns) {
  const std::string w0 = Connect("host-a", "cpu");
  const std::string w1 = Connect("host-b", "cpu");
  JobSpec spec = Spec(2);
  spec.knobs.timeline = "timeline.json";
  const std::string id = coordinator_.RegisterJob(spec)->id;
  ASSERT_TRUE(Submit(w1, id, 1, {Allreduce("grad")}).ok());
  clock_.Advance(absl::Microseconds(250));
  ASSERT_TRUE(Submit(w0, id, 0, {Allreduce("grad")}).ok());
  const int64_t now_us = absl::ToUnixMicros(clock_.Now());
  ExecutionSpan span{{"grad"},
                     "ALLREDUCE",
                     now_us + 10,
                     {{"QUEUE", now_us + 20}, {"GLOO_ALLREDUCE", now_us + 90}}};
  ASSERT_TRUE(coordinator_.RecordTimeline(w0, id, 1, 0, {span}).ok());
  // Only the worker that serves the rank may report it.
  EXPECT_EQ(coordinator_.RecordTimeline(w1, id, 1, 0, {span}).code(),
            absl::StatusCode::kFailedPrecondition);

  absl::StatusOr<std::vector<ArtifactInfo>> list = coordinator_.ListArtifacts(id);
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_THAT(*list, SizeIs(1));
  EXPECT_EQ((*list)[0].name, "timeline.json");
  // While the job runs: a snapshot, valid JSON whatever the writer is doing.
  EXPECT_TRUE(nlohmann::json::accept(ReadArtifact(id, "timeline.json")));

  ASSERT_TRUE(coordinator_.CancelJob(id, "").ok());  // closes the timeline: everything written
  const nlohmann::json trace = nlohmann::json::parse(ReadArtifact(id, "timeline.json"));
  std::vector<std::string> row;
  for (const auto& e : trace) {
    if (e["ph"] == "M") continue;
    row.push_back(absl::StrCat(std::string(e["ph"]),
                               e.contains("name") ? std::string(e["name"]) : "", "@",
                               e["ts"].get<int64_t>(), "/", e["tid"].get<int>()));
  }
  // Negotiation (thread 0): rank 1 first, rank 0 250 us later; then rank 0's execution (thread 1).
  EXPECT_THAT(row, ElementsAre("BNEGOTIATE_ALLREDUCE@0/0", "X1@0/0", "X0@250/0", "E@250/0",
                               "BALLREDUCE@260/1", "BQUEUE@260/1", "E@270/1",
                               "BGLOO_ALLREDUCE@270/1", "E@340/1", "E@340/1"));
  EXPECT_EQ(coordinator_.SnapshotArtifact(id, "nope.json").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(coordinator_.ListArtifacts("job-999999").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorTest, ArtifactNamesMustBePlainFileNames) {
  JobSpec spec = Spec(1);
  spec.knobs.timeline = "../etc/timeline.json";
  absl::StatusOr<Job> job = coordinator_.RegisterJob(spec);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      std::string(job.status().message()),
      ::testing::StartsWith("spec.knobs.timeline = '../etc/timeline.json' is not a file name"));
  spec.knobs.timeline = "run.json";
  spec.knobs.autotune_log = "run.json";
  job = coordinator_.RegisterJob(spec);
  EXPECT_EQ(job.status().message(),
            "spec.knobs.autotune_log = 'run.json' names the same file as knobs.timeline");
  spec.knobs.timeline = "";
  spec.knobs.autotune_log = "";
  spec.knobs.autotune_fixed = {"cycle_time"};
  job = coordinator_.RegisterJob(spec);
  EXPECT_EQ(
      job.status().message(),
      "spec.knobs.autotune_fixed[0] = 'cycle_time' is not a tunable knob (fusion_threshold_bytes, "
      "cycle_time_ms, cache_capacity)");
}

// Holds what the coordinator hands to its executor until the test runs it.
class ManualExecutor : public Executor {
 public:
  void Post(std::function<void()> task) override { tasks_.push_back(std::move(task)); }
  size_t pending() const { return tasks_.size(); }
  void RunAll() {
    while (!tasks_.empty()) {
      auto task = std::move(tasks_.front());
      tasks_.erase(tasks_.begin());
      task();
    }
  }

 private:
  std::vector<std::function<void()>> tasks_;
};

TEST(CoordinatorExecutorTest, SlowWorkWaitsForTheExecutorAndACancelledPlacementStartsNothing) {
  FakeClock clock;
  ManualExecutor executor;
  const std::string artifacts = absl::StrCat(std::filesystem::temp_directory_path().string(),
                                             "/coordinator_executor_test_", getpid());
  CoordinatorOptions o;
  o.clock = &clock;
  o.executor = &executor;
  o.artifacts_dir = artifacts;
  Coordinator coordinator(std::move(o));
  RecordingChannel c0, c1;
  const std::string w0 = coordinator.RegisterWorker("host-a", "cpu", {})->id;
  const std::string w1 = coordinator.RegisterWorker("host-a", "cpu", {})->id;
  ASSERT_TRUE(coordinator.OpenSession(w0, &c0).ok());
  ASSERT_TRUE(coordinator.OpenSession(w1, &c1).ok());
  JobSpec spec = Spec(2);
  spec.knobs.timeline = "timeline.json";

  // Placed at once (its workers are taken); its runtime's files and assignments wait.
  const std::string first = coordinator.RegisterJob(spec)->id;
  EXPECT_EQ(coordinator.GetJob(first)->state, JobState::kStarting);
  EXPECT_EQ(executor.pending(), 1u);
  EXPECT_THAT(c0.assignments, IsEmpty());
  ASSERT_TRUE(coordinator.CancelJob(first, "").ok());  // before the executor ran
  executor.RunAll();
  EXPECT_THAT(c0.assignments, IsEmpty());
  EXPECT_THAT(c1.assignments, IsEmpty());
  EXPECT_FALSE(std::filesystem::exists(artifacts + "/" + first + "/timeline.json"));

  // The next job starts once the executor runs; its ranks' exits end it there too.
  const std::string second = coordinator.RegisterJob(spec)->id;
  executor.RunAll();
  ASSERT_EQ(c0.assignments.size(), 1u);
  EXPECT_TRUE(std::filesystem::exists(artifacts + "/" + second + "/timeline.json"));
  for (auto [worker, rank] : {std::pair{w0, 0}, std::pair{w1, 1}}) {
    RankUpdate u;
    u.job_id = second;
    u.epoch = 1;
    u.rank = rank;
    u.state = RankState::kExited;
    ASSERT_TRUE(coordinator.UpdateRank(worker, u).ok());
  }
  EXPECT_EQ(coordinator.GetJob(second)->state, JobState::kStarting);
  std::optional<absl::StatusOr<Job>> cancelled;
  coordinator.CancelJob(second, "late", [&](absl::StatusOr<Job> j) { cancelled = std::move(j); });
  EXPECT_FALSE(cancelled.has_value());
  executor.RunAll();
  EXPECT_EQ(coordinator.GetJob(second)->state, JobState::kSucceeded);
  ASSERT_TRUE(cancelled.has_value());  // the cancel came after the success: refused
  EXPECT_EQ(cancelled->status().code(), absl::StatusCode::kFailedPrecondition);
  std::filesystem::remove_all(artifacts);
}

}  // namespace
}  // namespace ringmaster

namespace ringmaster {
namespace {

TEST(CoordinatorRetentionTest, EndedJobsAreRemovedPastTheirRetentionAndCountButIdsAreNeverReused) {
  FakeClock clock;
  CoordinatorOptions o;
  o.clock = &clock;
  o.artifacts_dir = absl::StrCat(std::filesystem::temp_directory_path().string(),
                                 "/coordinator_retention_test_", getpid());
  o.job_retention = absl::Hours(1);
  o.max_ended_jobs = 2;
  o.retention_check = absl::Seconds(1);
  Coordinator coordinator(std::move(o));
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<Job> job = coordinator.RegisterJob(Spec(1));
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_TRUE(coordinator.CancelJob(job->id, "done").ok());
    clock.Advance(absl::Seconds(1));
  }
  coordinator.Tick();  // 4 ended, 2 kept: the two oldest go
  auto ids = [&] {
    std::vector<std::string> out;
    for (const Job& j : coordinator.ListJobs({})) out.push_back(j.id);
    return out;
  };
  EXPECT_THAT(ids(), ElementsAre("job-000004", "job-000003"));
  EXPECT_EQ(coordinator.GetJob("job-000001").status().code(), absl::StatusCode::kNotFound);
  // An hour on, job-000003 has passed its retention; the newest job is kept whatever its age, so
  // that a restarted coordinator numbers on from it.
  clock.Advance(absl::Hours(2));
  coordinator.Tick();
  EXPECT_THAT(ids(), ElementsAre("job-000004"));
  absl::StatusOr<Job> next = coordinator.RegisterJob(Spec(1));
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->id, "job-000005");
  std::error_code error;
  std::filesystem::remove_all(absl::StrCat(std::filesystem::temp_directory_path().string(),
                                           "/coordinator_retention_test_", getpid()),
                              error);
}

}  // namespace
}  // namespace ringmaster
