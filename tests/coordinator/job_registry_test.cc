#include "coordinator/job_registry.h"

#include <algorithm>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/job.h"
#include "coordinator/job_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::SizeIs;

JobSpec ValidSpec() {
  JobSpec spec;
  spec.name = "train";
  spec.np = 2;
  return spec;
}

std::vector<RankInfo> TwoRanks() {
  std::vector<RankInfo> ranks(2);
  for (int r = 0; r < 2; ++r) {
    ranks[r].rank = r;
    ranks[r].worker_id = absl::StrCat("worker-00000", r + 1);
    ranks[r].host = "host-a";
    ranks[r].device = absl::StrCat("cuda:", r);
    ranks[r].local_rank = r;
    ranks[r].local_size = 2;
    ranks[r].cross_rank = 0;
    ranks[r].cross_size = 1;
  }
  return ranks;
}

std::vector<std::string> Messages(const Job& job) {
  std::vector<std::string> out;
  for (const JobEvent& e : job.events) out.push_back(e.message);
  return out;
}

class JobRegistryTest : public ::testing::Test {
 protected:
  std::string RegisterValid() {
    absl::StatusOr<Job> job = registry_.Register(ValidSpec());
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->id : "";
  }

  FakeClock clock_;
  JobRegistry registry_{JobStore::InMemory(), &clock_};
};

TEST_F(JobRegistryTest, RegisterRecordsAPendingJobWithAnEvent) {
  JobSpec spec = ValidSpec();
  spec.np = 3;
  spec.command = {"python", "train.py"};
  spec.env = {{"OMP_NUM_THREADS", "4"}};
  absl::StatusOr<Job> job = registry_.Register(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->id, "job-000001");
  EXPECT_EQ(job->state, JobState::kPending);
  EXPECT_EQ(job->reason, "");
  EXPECT_EQ(job->epoch, 0);
  EXPECT_THAT(job->ranks, IsEmpty());
  EXPECT_EQ(job->spec.np, 3);
  EXPECT_THAT(job->spec.command, ElementsAre("python", "train.py"));
  EXPECT_EQ(job->create_time, clock_.Now());
  EXPECT_EQ(job->update_time, clock_.Now());
  ASSERT_THAT(job->events, SizeIs(1));
  EXPECT_EQ(job->events[0].time, clock_.Now());
  EXPECT_EQ(job->events[0].state, JobState::kPending);
  EXPECT_EQ(job->events[0].message, "registered: 3 ranks");

  absl::StatusOr<Job> stored = registry_.Get("job-000001");
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->state, JobState::kPending);
  EXPECT_THAT(Messages(*stored), ElementsAre("registered: 3 ranks"));

  clock_.Advance(absl::Seconds(1));
  absl::StatusOr<Job> second = registry_.Register(ValidSpec());
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->id, "job-000002");
  EXPECT_EQ(second->create_time, clock_.Now());
}

// ---- Spec validation ----

struct SpecCase {
  std::string label;
  void (*change)(JobSpec&);
  std::string message;
};

class SpecValidationTest : public JobRegistryTest,
                           public ::testing::WithParamInterface<SpecCase> {};

TEST_P(SpecValidationTest, BadSpecIsRejectedNamingTheFieldAndRegistersNothing) {
  JobSpec spec = ValidSpec();
  GetParam().change(spec);
  absl::Status direct = ValidateJobSpec(spec);
  EXPECT_EQ(direct.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(direct.message(), GetParam().message);

  absl::StatusOr<Job> job = registry_.Register(spec);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(job.status().message(), GetParam().message);
  EXPECT_THAT(registry_.List({}), IsEmpty());
  EXPECT_EQ(RegisterValid(), "job-000001");  // no id was used up
}

INSTANTIATE_TEST_SUITE_P(
    JobRegistry, SpecValidationTest,
    ::testing::Values(
        SpecCase{"EmptyName", [](JobSpec& s) { s.name = ""; },
                 "spec.name must be 1..128 bytes; got 0"},
        SpecCase{"LongName", [](JobSpec& s) { s.name = std::string(129, 'n'); },
                 "spec.name must be 1..128 bytes; got 129"},
        SpecCase{"NameChar", [](JobSpec& s) { s.name = "my job"; },
                 "spec.name 'my job' may contain only letters, digits, '.', '_' and '-'"},
        SpecCase{"NpZero", [](JobSpec& s) { s.np = 0; }, "spec.np = 0 is out of bounds [1, 4096]"},
        SpecCase{"NpNegative", [](JobSpec& s) { s.np = -1; },
                 "spec.np = -1 is out of bounds [1, 4096]"},
        SpecCase{"NpTooLarge", [](JobSpec& s) { s.np = 4097; },
                 "spec.np = 4097 is out of bounds [1, 4096]"},
        SpecCase{"PerHostOverNp", [](JobSpec& s) { s.processes_per_host = 3; },
                 "spec.processes_per_host = 3 is out of bounds [0, np = 2]"},
        SpecCase{"PerHostNegative", [](JobSpec& s) { s.processes_per_host = -1; },
                 "spec.processes_per_host = -1 is out of bounds [0, np = 2]"},
        SpecCase{"EmptyProgram",
                 [](JobSpec& s) {
                   s.command = {"", "x"};
                 },
                 "spec.command[0] (the program) is empty"},
        SpecCase{"EnvKeyDigit",
                 [](JobSpec& s) {
                   s.env = {{"1X", "v"}};
                 },
                 "spec.env key '1X' is not a variable name ([A-Za-z_][A-Za-z0-9_]*)"},
        SpecCase{"EnvKeyDash",
                 [](JobSpec& s) {
                   s.env = {{"MY-VAR", "v"}};
                 },
                 "spec.env key 'MY-VAR' is not a variable name ([A-Za-z_][A-Za-z0-9_]*)"},
        SpecCase{"EnvKeyEmpty",
                 [](JobSpec& s) {
                   s.env = {{"", "v"}};
                 },
                 "spec.env key '' must be 1..256 bytes"},
        SpecCase{"EnvValueLong",
                 [](JobSpec& s) {
                   s.env = {{"V", std::string(65537, 'v')}};
                 },
                 "spec.env['V'] is longer than 65536 bytes"},
        SpecCase{"LabelKeyLong",
                 [](JobSpec& s) {
                   s.labels = {{std::string(64, 'k'), "v"}};
                 },
                 absl::StrCat("spec.labels key '", std::string(64, 'k'), "' must be 1..63 bytes")},
        SpecCase{"WorkingDir", [](JobSpec& s) { s.working_dir = std::string(4097, 'd'); },
                 "spec.working_dir is longer than 4096 bytes"},
        SpecCase{"CycleTimeNegative", [](JobSpec& s) { s.knobs.cycle_time_ms = -1; },
                 "spec.knobs.cycle_time_ms = -1 is out of bounds (0, 10000]"},
        SpecCase{"CycleTimeZero", [](JobSpec& s) { s.knobs.cycle_time_ms = 0; },
                 "spec.knobs.cycle_time_ms = 0 is out of bounds (0, 10000]"},
        SpecCase{"CycleTimeTooLong", [](JobSpec& s) { s.knobs.cycle_time_ms = 10001; },
                 "spec.knobs.cycle_time_ms = 10001 is out of bounds (0, 10000]"},
        SpecCase{"FusionNegative", [](JobSpec& s) { s.knobs.fusion_threshold_bytes = -1; },
                 "spec.knobs.fusion_threshold_bytes = -1 is out of bounds [0, 17179869184]"},
        SpecCase{"FusionTooLarge",
                 [](JobSpec& s) { s.knobs.fusion_threshold_bytes = (int64_t{16} << 30) + 1; },
                 "spec.knobs.fusion_threshold_bytes = 17179869185 is out of bounds "
                 "[0, 17179869184]"},
        SpecCase{"CacheTooLarge", [](JobSpec& s) { s.knobs.cache_capacity = 1048577; },
                 "spec.knobs.cache_capacity = 1048577 is out of bounds [0, 1048576]"},
        SpecCase{"CacheNegative", [](JobSpec& s) { s.knobs.cache_capacity = -1; },
                 "spec.knobs.cache_capacity = -1 is out of bounds [0, 1048576]"},
        SpecCase{"StallCheck", [](JobSpec& s) { s.knobs.stall_check_seconds = 86401; },
                 "spec.knobs.stall_check_seconds = 86401 is out of bounds [0, 86400]"},
        SpecCase{"StallShutdown", [](JobSpec& s) { s.knobs.stall_shutdown_seconds = -1; },
                 "spec.knobs.stall_shutdown_seconds = -1 is out of bounds [0, 86400]"},
        SpecCase{"RelayHostsZero", [](JobSpec& s) { s.knobs.negotiation_relay_hosts = 0; },
                 "spec.knobs.negotiation_relay_hosts = 0 is out of bounds [1, 64]"},
        SpecCase{"RelayHostsTooMany", [](JobSpec& s) { s.knobs.negotiation_relay_hosts = 65; },
                 "spec.knobs.negotiation_relay_hosts = 65 is out of bounds [1, 64]"}),
    [](const ::testing::TestParamInfo<SpecCase>& info) { return info.param.label; });

TEST(ValidateJobSpecTest, AcceptsTheBoundaries) {
  JobSpec spec = ValidSpec();
  spec.name = std::string(128, 'n');
  EXPECT_TRUE(ValidateJobSpec(spec).ok());
  spec.name = "Train_v2.1-final";
  spec.np = 1;
  EXPECT_TRUE(ValidateJobSpec(spec).ok());
  spec.np = 4096;
  spec.processes_per_host = 4096;
  EXPECT_TRUE(ValidateJobSpec(spec).ok());
  spec.env = {{"_A1", ""}, {"HOROVOD_FUSION_THRESHOLD", "0"}};
  spec.labels = {{std::string(63, 'k'), std::string(256, 'v')}};
  spec.knobs.cycle_time_ms = 10000;
  spec.knobs.fusion_threshold_bytes = 0;
  spec.knobs.cache_capacity = 0;
  spec.knobs.stall_check_seconds = 86400;
  EXPECT_TRUE(ValidateJobSpec(spec).ok());
}

// ---- State machine ----

// Drives a fresh job to `state` along the usual path.
absl::Status DriveTo(JobRegistry& registry, const std::string& id, JobState state) {
  switch (state) {
    case JobState::kPending:
      return absl::OkStatus();
    case JobState::kStarting:
      return registry.Start(id, TwoRanks(), "scheduled").status();
    case JobState::kRunning:
      if (absl::Status s = DriveTo(registry, id, JobState::kStarting); !s.ok()) return s;
      return registry.Transition(id, JobState::kRunning, "running").status();
    case JobState::kSucceeded:
      if (absl::Status s = DriveTo(registry, id, JobState::kRunning); !s.ok()) return s;
      return registry.Transition(id, JobState::kSucceeded, "done").status();
    case JobState::kFailed:
    case JobState::kCancelled:
      return registry.Transition(id, state, "ended").status();
  }
  return absl::InternalError("unreachable");
}

constexpr JobState kAllStates[] = {JobState::kPending,   JobState::kStarting, JobState::kRunning,
                                   JobState::kSucceeded, JobState::kFailed,   JobState::kCancelled};

// The documented machine: PENDING -> STARTING -> RUNNING -> SUCCEEDED | FAILED | CANCELLED;
// PENDING and STARTING may also end FAILED or CANCELLED, and STARTING may end SUCCEEDED (every rank
// exited 0 before all reported STARTED).
bool ShouldAllow(JobState from, JobState to) {
  using S = JobState;
  const std::pair<S, S> allowed[] = {{S::kPending, S::kStarting},   {S::kPending, S::kFailed},
                                     {S::kPending, S::kCancelled},  {S::kStarting, S::kRunning},
                                     {S::kStarting, S::kSucceeded}, {S::kStarting, S::kFailed},
                                     {S::kStarting, S::kCancelled}, {S::kRunning, S::kSucceeded},
                                     {S::kRunning, S::kFailed},     {S::kRunning, S::kCancelled}};
  return std::find(std::begin(allowed), std::end(allowed), std::make_pair(from, to)) !=
         std::end(allowed);
}

class TransitionTest : public JobRegistryTest,
                       public ::testing::WithParamInterface<std::tuple<JobState, JobState>> {};

TEST_P(TransitionTest, AllowedMovesSucceedAndOthersAreRefusedLeavingTheJobUnchanged) {
  const auto [from, to] = GetParam();
  const std::string id = RegisterValid();
  ASSERT_TRUE(DriveTo(registry_, id, from).ok());
  absl::StatusOr<Job> before = registry_.Get(id);
  ASSERT_TRUE(before.ok());
  ASSERT_EQ(before->state, from);

  clock_.Advance(absl::Seconds(5));
  absl::StatusOr<Job> after = registry_.Transition(id, to, "the move");
  if (ShouldAllow(from, to)) {
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_EQ(after->state, to);
    EXPECT_EQ(after->update_time, clock_.Now());
    ASSERT_EQ(after->events.size(), before->events.size() + 1);
    EXPECT_EQ(after->events.back().state, to);
    EXPECT_EQ(after->events.back().message, "the move");
    EXPECT_EQ(after->events.back().time, clock_.Now());
    EXPECT_EQ(after->reason, IsTerminal(to) ? "the move" : "");
    EXPECT_EQ(registry_.Get(id)->state, to);
  } else {
    EXPECT_EQ(after.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(after.status().message(), absl::StrCat("job ", id, " is ", JobStateName(from),
                                                     "; it cannot become ", JobStateName(to)));
    absl::StatusOr<Job> unchanged = registry_.Get(id);
    ASSERT_TRUE(unchanged.ok());
    EXPECT_EQ(unchanged->state, from);
    EXPECT_EQ(unchanged->reason, before->reason);
    EXPECT_EQ(unchanged->update_time, before->update_time);
    EXPECT_EQ(Messages(*unchanged), Messages(*before));
  }
}

INSTANTIATE_TEST_SUITE_P(JobRegistry, TransitionTest,
                         ::testing::Combine(::testing::ValuesIn(kAllStates),
                                            ::testing::ValuesIn(kAllStates)),
                         [](const auto& info) {
                           return absl::StrCat(JobStateName(std::get<0>(info.param)), "_to_",
                                               JobStateName(std::get<1>(info.param)));
                         });

TEST_F(JobRegistryTest, StartPlacesRanksAndBumpsTheEpochOnce) {
  const std::string id = RegisterValid();
  absl::StatusOr<Job> started = registry_.Start(id, TwoRanks(), "scheduled 2 ranks");
  ASSERT_TRUE(started.ok()) << started.status();
  EXPECT_EQ(started->state, JobState::kStarting);
  EXPECT_EQ(started->epoch, 1);
  ASSERT_THAT(started->ranks, SizeIs(2));
  EXPECT_EQ(started->ranks[1].worker_id, "worker-000002");
  EXPECT_EQ(started->events.back().message, "scheduled 2 ranks");
  EXPECT_EQ(started->events.back().state, JobState::kStarting);

  absl::StatusOr<Job> again = registry_.Start(id, {}, "again");
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(again.status().message(), "job job-000001 is STARTING; it cannot start");
  absl::StatusOr<Job> stored = registry_.Get(id);
  EXPECT_EQ(stored->epoch, 1);
  EXPECT_THAT(stored->ranks, SizeIs(2));

  const std::string cancelled = RegisterValid();
  ASSERT_TRUE(registry_.Transition(cancelled, JobState::kCancelled, "user").ok());
  EXPECT_EQ(registry_.Start(cancelled, TwoRanks(), "late").status().message(),
            "job job-000002 is CANCELLED; it cannot start");
  EXPECT_EQ(registry_.Get(cancelled)->epoch, 0);
}

TEST_F(JobRegistryTest, UpdateRankRecordsStateWithoutAnEvent) {
  const std::string id = RegisterValid();
  ASSERT_TRUE(registry_.Start(id, TwoRanks(), "scheduled").ok());
  clock_.Advance(absl::Seconds(2));
  absl::StatusOr<Job> job = registry_.UpdateRank(id, 1, RankState::kExited, 7);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->ranks[1].state, RankState::kExited);
  EXPECT_EQ(job->ranks[1].exit_code, 7);
  EXPECT_EQ(job->ranks[0].state, RankState::kAssigned);
  EXPECT_EQ(job->update_time, clock_.Now());
  EXPECT_THAT(job->events, SizeIs(2));
  EXPECT_EQ(registry_.Get(id)->ranks[1].exit_code, 7);

  absl::StatusOr<Job> bad = registry_.UpdateRank(id, 2, RankState::kStarted, 0);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "rank 2 is out of bounds for job job-000001 of 2");
  EXPECT_EQ(registry_.UpdateRank(id, -1, RankState::kStarted, 0).status().message(),
            "rank -1 is out of bounds for job job-000001 of 2");
  EXPECT_EQ(registry_.UpdateRank("job-000009", 0, RankState::kStarted, 0).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(JobRegistryTest, GetChecksTheId) {
  absl::StatusOr<Job> missing = registry_.Get("job-000009");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(), "job 'job-000009' not found");
  absl::StatusOr<Job> empty = registry_.Get("");
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(empty.status().message(), "job_id must be 1..64 bytes; got 0");
  EXPECT_EQ(registry_.Get(std::string(65, 'j')).status().message(),
            "job_id must be 1..64 bytes; got 65");
  EXPECT_EQ(registry_.Transition("job-000009", JobState::kCancelled, "x").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(JobRegistryTest, ListIsNewestFirstAndFiltersByState) {
  const std::string a = RegisterValid();
  const std::string b = RegisterValid();
  const std::string c = RegisterValid();
  ASSERT_TRUE(registry_.Transition(b, JobState::kCancelled, "user").ok());
  std::vector<std::string> ids;
  for (const Job& j : registry_.List({})) ids.push_back(j.id);
  EXPECT_THAT(ids, ElementsAre(c, b, a));
  ids.clear();
  for (const Job& j : registry_.List({JobState::kPending})) ids.push_back(j.id);
  EXPECT_THAT(ids, ElementsAre(c, a));
  ids.clear();
  for (const Job& j : registry_.List({JobState::kCancelled, JobState::kRunning})) {
    ids.push_back(j.id);
  }
  EXPECT_THAT(ids, ElementsAre(b));
}

TEST_F(JobRegistryTest, WatchersSeeEveryEventInOrderUntilUnwatched) {
  const std::string id = RegisterValid();
  std::vector<std::pair<JobState, std::string>> seen;
  absl::StatusOr<int64_t> watch = registry_.Watch(id, [&](const Job& job, const JobEvent& event) {
    EXPECT_EQ(job.state, event.state);
    EXPECT_EQ(job.events.back().message, event.message);
    seen.emplace_back(event.state, event.message);
  });
  ASSERT_TRUE(watch.ok()) << watch.status();

  ASSERT_TRUE(registry_.Start(id, TwoRanks(), "scheduled").ok());
  ASSERT_TRUE(registry_.AddEvent(id, "stall report").ok());
  ASSERT_TRUE(registry_.Transition(id, JobState::kRunning, "all 2 ranks started").ok());
  EXPECT_FALSE(registry_.Transition(id, JobState::kPending, "refused").ok());  // no event
  registry_.Unwatch(id, *watch);
  ASSERT_TRUE(registry_.Transition(id, JobState::kFailed, "boom").ok());

  EXPECT_THAT(
      seen,
      ElementsAre(std::pair<JobState, std::string>(JobState::kStarting, "scheduled"),
                  std::pair<JobState, std::string>(JobState::kStarting, "stall report"),
                  std::pair<JobState, std::string>(JobState::kRunning, "all 2 ranks started")));

  EXPECT_EQ(registry_.Watch("job-000009", [](const Job&, const JobEvent&) {}).status().code(),
            absl::StatusCode::kNotFound);
  registry_.Unwatch("job-000009", 1);  // harmless
}

TEST_F(JobRegistryTest, AddEventKeepsTheState) {
  const std::string id = RegisterValid();
  clock_.Advance(absl::Seconds(3));
  ASSERT_TRUE(registry_.AddEvent(id, "note").ok());
  absl::StatusOr<Job> job = registry_.Get(id);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state, JobState::kPending);
  EXPECT_THAT(Messages(*job), ElementsAre("registered: 2 ranks", "note"));
  EXPECT_EQ(job->events.back().state, JobState::kPending);
  EXPECT_EQ(job->events.back().time, clock_.Now());
  EXPECT_EQ(registry_.AddEvent("job-000009", "x").code(), absl::StatusCode::kNotFound);
}

TEST(JobStateNameTest, NamesAndTerminality) {
  EXPECT_EQ(JobStateName(JobState::kPending), "PENDING");
  EXPECT_EQ(JobStateName(JobState::kStarting), "STARTING");
  EXPECT_EQ(JobStateName(JobState::kRunning), "RUNNING");
  EXPECT_EQ(JobStateName(JobState::kSucceeded), "SUCCEEDED");
  EXPECT_EQ(JobStateName(JobState::kFailed), "FAILED");
  EXPECT_EQ(JobStateName(JobState::kCancelled), "CANCELLED");
  EXPECT_FALSE(IsTerminal(JobState::kPending));
  EXPECT_FALSE(IsTerminal(JobState::kStarting));
  EXPECT_FALSE(IsTerminal(JobState::kRunning));
  EXPECT_TRUE(IsTerminal(JobState::kSucceeded));
  EXPECT_TRUE(IsTerminal(JobState::kFailed));
  EXPECT_TRUE(IsTerminal(JobState::kCancelled));
}

}  // namespace
}  // namespace ringmaster

namespace ringmaster {
namespace {

TEST(JobRegistryBoundsTest, AtMostMaxActiveJobsAndTheSlotsComeBackWhenJobsEnd) {
  FakeClock clock;
  JobRegistry registry(JobStore::InMemory(), &clock, /*max_active=*/3);
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(registry.Register(ValidSpec())->id);
  absl::StatusOr<Job> refused = registry.Register(ValidSpec());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(refused.status().message(),
            "the coordinator holds 3 jobs that have not ended, the most it takes "
            "(--max-active-jobs): wait for some to end, or cancel some");
  EXPECT_EQ(registry.List({}).size(), 3u);  // nothing recorded
  ASSERT_TRUE(registry.Transition(ids[0], JobState::kCancelled, "cancelled").ok());
  absl::StatusOr<Job> next = registry.Register(ValidSpec());
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->id, "job-000004");
}

TEST(JobRegistryBoundsTest, ASpecIsBoundedAsAWholeAndAnEndedJobKeepsNoEnvironmentValues) {
  FakeClock clock;
  JobRegistry registry(JobStore::InMemory(), &clock);
  JobSpec big = ValidSpec();
  for (int i = 0; i < 5; ++i) big.env[absl::StrCat("V", i)] = std::string(60000, 'x');
  absl::StatusOr<Job> refused = registry.Register(big);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()), ::testing::StartsWith("spec holds 30"));
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::EndsWith(" bytes of command, env, labels, name and working_dir; at most "
                                  "262144"));
  JobSpec spec = ValidSpec();
  spec.env["AWS_SECRET_ACCESS_KEY"] = "hunter2";
  absl::StatusOr<Job> job = registry.Register(spec);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(registry.Get(job->id)->spec.env.at("AWS_SECRET_ACCESS_KEY"), "hunter2");
  ASSERT_TRUE(registry.Transition(job->id, JobState::kCancelled, "cancelled").ok());
  EXPECT_EQ(registry.Get(job->id)->spec.env.at("AWS_SECRET_ACCESS_KEY"), "");
}

}  // namespace
}  // namespace ringmaster

namespace ringmaster {
namespace {

// One user cannot take the cluster: a per-user bound on jobs not ended, and on registrations per
// minute, each refused naming the limit; other users are still served.
TEST(JobRegistryLimitsTest, OneUserIsBoundedAndOthersAreStillServed) {
  FakeClock clock;
  JobRegistry registry(
      JobStore::InMemory(), &clock,
      JobRegistry::Limits{
          .max_active = 100, .max_active_per_user = 3, .max_registrations_per_minute = 5});
  std::vector<std::string> alices;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<Job> job = registry.Register(ValidSpec(), "alice");
    ASSERT_TRUE(job.ok()) << job.status();
    alices.push_back(job->id);
  }
  absl::StatusOr<Job> more = registry.Register(ValidSpec(), "alice");
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(more.status().message(),
            "user 'alice' holds 3 jobs that have not ended, the most one user may "
            "(--max-active-jobs-per-user): wait for some to end, or cancel some");
  EXPECT_TRUE(registry.Register(ValidSpec(), "bob").ok());
  // An ended job frees its place; but the refused one counted no registration.
  ASSERT_TRUE(registry.Transition(alices[0], JobState::kCancelled, "cancelled").ok());
  ASSERT_TRUE(registry.Register(ValidSpec(), "alice").ok());  // the 4th in this minute
  ASSERT_TRUE(registry.Transition(alices[1], JobState::kCancelled, "cancelled").ok());
  ASSERT_TRUE(registry.Transition(alices[2], JobState::kCancelled, "cancelled").ok());
  clock.Advance(absl::Seconds(20));
  ASSERT_TRUE(registry.Register(ValidSpec(), "alice").ok());  // the 5th
  more = registry.Register(ValidSpec(), "alice");
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(more.status().message(),
            "user 'alice' registered 5 jobs in the last minute, the most one user may "
            "(--max-registrations-per-minute): retry in 40s");
  EXPECT_TRUE(registry.Register(ValidSpec(), "bob").ok());
  // A minute after the first ones, alice may register again.
  clock.Advance(absl::Seconds(40));
  EXPECT_TRUE(registry.Register(ValidSpec(), "alice").ok());
}

TEST(JobRegistryLimitsTest, ARetriedRegistrationWithItsRequestIdReturnsTheSameJob) {
  FakeClock clock;
  JobRegistry registry(JobStore::InMemory(), &clock,
                       JobRegistry::Limits{.max_active = 100, .max_active_per_user = 2});
  JobSpec spec = ValidSpec();
  spec.request_id = "submit-1";
  absl::StatusOr<Job> first = registry.Register(spec, "alice");
  ASSERT_TRUE(first.ok());
  absl::StatusOr<Job> again = registry.Register(spec, "alice");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->id, first->id);
  EXPECT_THAT(registry.List({}), SizeIs(1));
  // Another owner's identical key is another registration; another key is another job.
  absl::StatusOr<Job> bobs = registry.Register(spec, "bob");
  ASSERT_TRUE(bobs.ok());
  EXPECT_NE(bobs->id, first->id);
  spec.request_id = "submit-2";
  absl::StatusOr<Job> second = registry.Register(spec, "alice");
  ASSERT_TRUE(second.ok());
  EXPECT_NE(second->id, first->id);
  // At alice's bound, a retry of a registration that went through still answers with its job.
  spec.request_id = "submit-1";
  again = registry.Register(spec, "alice");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->id, first->id);
  spec.request_id = std::string(129, 'x');
  EXPECT_EQ(registry.Register(spec, "alice").status().message(),
            "spec.request_id must be at most 128 bytes; got 129");
}

}  // namespace
}  // namespace ringmaster
