// The timeline file: Chrome-trace JSON that parses whenever it is read, with Horovod's activity
// names, one row per tensor and properly nested begin/end pairs.
#include "coordinator/timeline.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ringmaster {
namespace {

using ::testing::ElementsAre;
using json = nlohmann::json;

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class TimelineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("timeline_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "timeline.json").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path dir_;
  std::string path_;
  const absl::Time start_ = absl::FromUnixSeconds(1'700'000'000);
};

absl::Time At(absl::Time start, int64_t us) { return start + absl::Microseconds(us); }

// Events of `pid` (a tensor's row) on thread `tid`, metadata excluded.
std::vector<json> Row(const json& trace, int pid, int tid) {
  std::vector<json> out;
  for (const json& e : trace) {
    if (e["ph"] != "M" && e.value("pid", -1) == pid && e.value("tid", -1) == tid) out.push_back(e);
  }
  return out;
}

int PidOf(const json& trace, const std::string& tensor) {
  for (const json& e : trace) {
    if (e["ph"] == "M" && e["name"] == "process_name" && e["args"]["name"] == tensor) {
      return e["pid"];
    }
  }
  return -1;
}

TEST_F(TimelineTest, AFreshTimelineIsAnEmptyArray) {
  auto timeline = Timeline::Create(path_, "job j", false, start_);
  ASSERT_TRUE(timeline.ok()) << timeline.status();
  EXPECT_EQ(Slurp(path_), "[\n]\n");
  EXPECT_TRUE(json::parse(Slurp(path_)).is_array());
}

TEST_F(TimelineTest, WritesNegotiationAndExecutionRowsPerTensor) {
  auto created = Timeline::Create(path_, "job j", true, start_);
  ASSERT_TRUE(created.ok()) << created.status();
  Timeline& t = **created;
  using K = NegotiationEvent::Kind;
  t.Negotiation({{K::kStart, "grad/a", RequestType::kAllreduce, 1, At(start_, 100), 0, {}},
                 {K::kRankReady, "grad/a", RequestType::kAllreduce, 1, At(start_, 100), 0, {}},
                 {K::kStart, "grad/b", RequestType::kAllreduce, 0, At(start_, 120), 0, {}},
                 {K::kRankReady, "grad/b", RequestType::kAllreduce, 0, At(start_, 120), 0, {}},
                 {K::kRankReady, "grad/a", RequestType::kAllreduce, 0, At(start_, 150), 0, {}},
                 {K::kEnd, "grad/a", RequestType::kAllreduce, -1, At(start_, 150), 0, {}},
                 {K::kRankReady, "grad/b", RequestType::kAllreduce, 1, At(start_, 160), 0, {}},
                 {K::kEnd, "grad/b", RequestType::kAllreduce, -1, At(start_, 160), 0, {}}});
  t.Cycle(At(start_, 170));
  const int64_t base = absl::ToUnixMicros(start_);
  t.Execution(0, {ExecutionSpan{{"grad/a", "grad/b"},
                                "ALLREDUCE",
                                base + 200,
                                {{"QUEUE", base + 210},
                                 {"MEMCPY_IN_FUSION_BUFFER", base + 230},
                                 {"GLOO_ALLREDUCE", base + 400},
                                 {"MEMCPY_OUT_FUSION_BUFFER", base + 420}}}});
  t.Close();
  const json trace = json::parse(Slurp(path_));
  const int a = PidOf(trace, "grad/a"), b = PidOf(trace, "grad/b");
  ASSERT_GT(a, 0);
  ASSERT_GT(b, 0);
  EXPECT_NE(a, b);

  const std::vector<json> negotiation = Row(trace, a, 0);
  ASSERT_EQ(negotiation.size(), 4u);
  EXPECT_EQ(negotiation[0], json::parse(R"({"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 100,
                                            "pid": )" +
                                        std::to_string(a) + R"(, "tid": 0})"));
  EXPECT_EQ(negotiation[1]["ph"], "X");
  EXPECT_EQ(negotiation[1]["name"], "1");  // the ranks tick in the order they submitted
  EXPECT_EQ(negotiation[2]["name"], "0");
  EXPECT_EQ(negotiation[2]["ts"], 150);
  EXPECT_EQ(negotiation[3]["ph"], "E");
  EXPECT_EQ(negotiation[3]["ts"], 150);

  for (int pid : {a, b}) {
    std::vector<std::string> shape;
    for (const json& e : Row(trace, pid, 1)) {
      shape.push_back(std::string(e["ph"]) + (e.contains("name") ? std::string(e["name"]) : "") +
                      "@" + std::to_string(e["ts"].get<int64_t>()));
    }
    EXPECT_THAT(shape, ElementsAre("BALLREDUCE@200", "BQUEUE@200", "E@210",
                                   "BMEMCPY_IN_FUSION_BUFFER@210", "E@230", "BGLOO_ALLREDUCE@230",
                                   "E@400", "BMEMCPY_OUT_FUSION_BUFFER@400", "E@420", "E@420"));
  }
  int cycles = 0;
  for (const json& e : trace) {
    if (e.value("name", "") == "CYCLE_START") {
      ++cycles;
      EXPECT_EQ(e["ts"], 170);
      EXPECT_EQ(e["ph"], "i");
    }
  }
  EXPECT_EQ(cycles, 1);
}

TEST_F(TimelineTest, CycleMarkersOnlyWhenAskedFor) {
  auto t = Timeline::Create(path_, "job j", false, start_);
  ASSERT_TRUE(t.ok());
  (*t)->Cycle(At(start_, 5));
  (*t)->Close();
  EXPECT_EQ(Slurp(path_).find("CYCLE_START"), std::string::npos);
}

TEST_F(TimelineTest, TensorNamesAreEscaped) {
  auto t = Timeline::Create(path_, "job j", false, start_);
  ASSERT_TRUE(t.ok());
  (*t)->Negotiation({{NegotiationEvent::Kind::kStart,
                      "we\"ird\\name\n",
                      RequestType::kBroadcast,
                      0,
                      At(start_, 1),
                      0,
                      {}}});
  (*t)->Close();
  const json trace = json::parse(Slurp(path_));
  EXPECT_GT(PidOf(trace, "we\"ird\\name\n"), 0);
  EXPECT_EQ(Row(trace, PidOf(trace, "we\"ird\\name\n"), 0)[0]["name"], "NEGOTIATE_BROADCAST");
}

TEST_F(TimelineTest, StablePrefixPlusTailIsAlwaysValidJson) {
  auto created = Timeline::Create(path_, "job j", false, start_);
  ASSERT_TRUE(created.ok());
  Timeline& t = **created;
  for (int i = 0; i < 20; ++i) {
    t.Negotiation({{NegotiationEvent::Kind::kStart,
                    "t" + std::to_string(i),
                    RequestType::kAllreduce,
                    0,
                    At(start_, i),
                    0,
                    {}}});
    absl::SleepFor(absl::Milliseconds(15));
    // What the coordinator serves for a live timeline: the stable prefix, then the tail.
    const std::string file = Slurp(path_);
    const int64_t stable = t.StableSize();
    ASSERT_LE(stable, static_cast<int64_t>(file.size()));
    const std::string snapshot = file.substr(0, stable) + Timeline::kTail;
    EXPECT_TRUE(json::accept(snapshot)) << snapshot;
  }
}

TEST_F(TimelineTest, AProcessKilledWhileWritingLeavesValidJson) {
  for (int round = 0; round < 3; ++round) {
    std::filesystem::remove(path_);  // each round's file is its own
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      auto t = Timeline::Create(path_, "job j", true, absl::Now());
      if (!t.ok()) _exit(1);
      for (int i = 0;; ++i) {
        (*t)->Negotiation({{NegotiationEvent::Kind::kStart,
                            "tensor." + std::to_string(i % 50),
                            RequestType::kAllreduce,
                            0,
                            absl::Now(),
                            0,
                            {}}});
        (*t)->Cycle(absl::Now());
        if (i % 100 == 0) usleep(1000);
      }
    }
    // Killed mid-stream: once it has written a good part (however slowly it is scheduled), at a
    // different moment each round.
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (Slurp(path_).size() < 4000 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    absl::SleepFor(absl::Milliseconds(20 + 35 * round));
    kill(child, SIGKILL);
    int status;
    waitpid(child, &status, 0);
    const std::string file = Slurp(path_);
    ASSERT_TRUE(json::accept(file)) << "round " << round << ": " << file.size() << " bytes";
    EXPECT_GT(json::parse(file).size(), 10u);
  }
}

TEST_F(TimelineTest, ARankWhoseClockIsOffIsMovedOntoOursByOneFixedOffset) {
  auto created = Timeline::Create(path_, "job j", false, start_);
  ASSERT_TRUE(created.ok()) << created.status();
  Timeline& t = **created;
  const int64_t base = absl::ToUnixMicros(start_);
  const int64_t ahead = 420'000'000;  // the rank's host is 7 minutes ahead
  auto span = [](const std::string& tensor, int64_t start) {
    return ExecutionSpan{{tensor}, "ALLREDUCE", start, {{"GLOO_ALLREDUCE", start + 10}}};
  };
  // Its spans come in its clock; the skew seen on arrival includes the transit time, which varies:
  // the first one (of 1 s or more) is kept, so the row keeps its order.
  t.Execution(0, {span("a", base + ahead + 100)}, -ahead - 40);
  t.Execution(0, {span("a", base + ahead + 200)}, -ahead - 2);
  // Clocks within a second are taken as they are.
  t.Execution(1, {span("b", base + 300)}, -900'000);
  t.Close();
  const json trace = json::parse(Slurp(path_));
  std::vector<int64_t> a, b;
  for (const json& e : Row(trace, PidOf(trace, "a"), 1)) a.push_back(e["ts"]);
  for (const json& e : Row(trace, PidOf(trace, "b"), 2)) b.push_back(e["ts"]);  // rank 1
  EXPECT_THAT(a, ElementsAre(60, 60, 70, 70, 160, 160, 170, 170));
  EXPECT_THAT(b, ElementsAre(300, 300, 310, 310));
}

}  // namespace
}  // namespace ringmaster
