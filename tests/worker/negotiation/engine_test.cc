// The engine over a fake executor: what it sends the coordinator (one batch per cycle, cached ids
// once assigned, re-sent requests), how it turns responses into collectives (fused order, joined
// tensors, scale factors), and how completions reach exactly the operations concerned: negotiation
// errors, a failure the executor calls fatal (everything else fails too) or not (the rest goes on),
// join, and a communicator that could not be set up.
#include "worker/negotiation/engine.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/negotiation_wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/negotiation/engine_wire.h"

namespace ringmaster {
namespace {

using ::testing::AnyOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;
using ::testing::UnorderedElementsAre;

// Records each collective as a line; fails when told to.
class FakeExecutor : public Executor {
 public:
  struct State {
    absl::Mutex mu;
    std::vector<std::string> calls ABSL_GUARDED_BY(mu);
    std::vector<std::string> aborts ABSL_GUARDED_BY(mu);
    absl::Status setup ABSL_GUARDED_BY(mu);
    absl::Status fail ABSL_GUARDED_BY(mu);
    bool fatal ABSL_GUARDED_BY(mu) = true;
    // When set, Setup() waits for it (a Gloo pair connect that cannot be cancelled).
    absl::Notification* hold_setup = nullptr;
  };
  explicit FakeExecutor(State* state) : state_(*state) {}

  absl::Status Setup() override {
    if (state_.hold_setup != nullptr) state_.hold_setup->WaitForNotification();
    absl::MutexLock lock(&state_.mu);
    return state_.setup;
  }
  absl::StatusOr<Executed> Execute(const Collective& c, ExecutionTrace& trace) override {
    const char* types[] = {"allreduce", "allgather", "broadcast", "barrier"};
    std::string call =
        absl::StrCat(types[static_cast<int>(c.type)], " dtype=", static_cast<int>(c.dtype),
                     " op=", static_cast<int>(c.op), " pre=", c.prescale, " post=", c.postscale,
                     " root=", c.root, " sizes=", absl::StrJoin(c.sizes, "/"));
    for (const Collective::Tensor& t : c.tensors) {
      absl::StrAppend(&call, " [", t.offset, " e", t.ready_event, " ", absl::StrJoin(t.shape, "x"),
                      "]");
    }
    trace.End("FAKE");
    absl::MutexLock lock(&state_.mu);
    state_.calls.push_back(call);
    if (!state_.fail.ok()) return state_.fail;
    Executed e;
    e.done_event = 5;
    if (c.type == Collective::Type::kAllgather) {
      for (size_t i = 0; i < c.tensors.size(); ++i) {
        e.outputs.push_back({static_cast<int64_t>(1000 + i), {static_cast<int64_t>(i + 2), 3}});
      }
    }
    return e;
  }
  bool Fatal(const absl::Status& /*status*/) const override {
    absl::MutexLock lock(&state_.mu);
    return state_.fatal;
  }
  void Abort(const std::string& why) override {
    absl::MutexLock lock(&state_.mu);
    state_.aborts.push_back(why);
  }
  void ReleaseProcessSet(int32_t id) override {
    absl::MutexLock lock(&state_.mu);
    state_.calls.push_back(absl::StrCat("release set ", id));
  }

 private:
  State& state_;
};

class EngineTest : public ::testing::Test {
 protected:
  void Start(absl::Duration cycle = absl::Milliseconds(1),
             size_t max_in_flight = EngineOptions::kDefaultMaxInFlight) {
    EngineOptions o;
    o.max_in_flight = max_in_flight;
    o.job_id = "job-000003";
    o.epoch = 2;
    o.rank = 1;
    o.size = 2;
    o.host = "host-b";
    o.arena_bytes = 1 << 16;
    o.cycle_time = cycle;
    o.clock = &clock_;
    o.executor = std::make_unique<FakeExecutor>(&executor_);
    // As the daemon does: what the engine sends is converted to the session's messages.
    o.send_requests = [this](const RequestBatch& batch) {
      v1::WorkerMessage m;
      ToProto(batch, m.mutable_requests());
      absl::MutexLock lock(&mu_);
      sent_.push_back(std::move(m));
    };
    o.send_span = [this](const ExecutionSpan& span, int64_t sent_unix_us) {
      v1::WorkerMessage m;
      ToProto(span, m.mutable_timeline()->add_spans());
      m.mutable_timeline()->set_sent_unix_us(sent_unix_us);
      absl::MutexLock lock(&mu_);
      sent_.push_back(std::move(m));
    };
    engine_ = std::make_unique<Engine>(std::move(o));
    engine_->Start();
  }

  void Enqueue(uint64_t handle, const std::string& name, v1::RequestType type,
               std::vector<int64_t> shape, int64_t offset, int32_t ready_event = 0) {
    v1::LocalEnqueue e;
    e.set_handle(handle);
    e.set_offset(offset);
    e.set_ready_event(ready_event);
    v1::TensorRequest* r = e.mutable_request();
    r->set_name(name);
    r->set_type(type);
    r->set_dtype(v1::DATA_TYPE_FLOAT32);
    for (int64_t d : shape) r->add_shape(d);
    LocalOp op;
    FromProto(e, &op);
    engine_->Enqueue(std::move(op), [this, handle](const OpResult& result) {
      v1::LocalCompletion c;
      ToProto(result, handle, &c);
      absl::MutexLock lock(&mu_);
      completions_[handle] = c;
    });
  }

  // A response list from the session, converted as the daemon converts it.
  void Deliver(const v1::ResponseList& list) {
    RankCycle cycle;
    FromProto(list, &cycle);
    engine_->OnResponses(std::move(cycle));
  }

  v1::LocalCompletion WaitFor(uint64_t handle) {
    absl::MutexLock lock(&mu_);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return completions_.contains(handle); };
    EXPECT_TRUE(mu_.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(10)))
        << "no completion for handle " << handle;
    return completions_.contains(handle) ? completions_[handle] : v1::LocalCompletion();
  }
  bool Completed(uint64_t handle) {
    absl::MutexLock lock(&mu_);
    return completions_.contains(handle);
  }

  // The request batches sent so far, each as "name,name|#id,#id".
  std::vector<std::string> Batches(size_t at_least) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      size_t n = 0;
      for (const v1::WorkerMessage& m : sent_) n += m.has_requests();
      return n >= at_least;
    };
    EXPECT_TRUE(mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10)));
    std::vector<std::string> out;
    for (const v1::WorkerMessage& m : sent_) {
      if (!m.has_requests()) continue;
      EXPECT_EQ(m.requests().job_id(), "job-000003");
      EXPECT_EQ(m.requests().epoch(), 2);
      EXPECT_EQ(m.requests().rank(), 1);
      std::vector<std::string> names, ids;
      for (const v1::TensorRequest& r : m.requests().requests()) names.push_back(r.name());
      for (uint32_t id : m.requests().cached_ids()) ids.push_back(absl::StrCat("#", id));
      out.push_back(absl::StrCat(absl::StrJoin(names, ","), "|", absl::StrJoin(ids, ",")));
    }
    return out;
  }

  std::vector<std::string> Calls() {
    absl::MutexLock lock(&executor_.mu);
    return executor_.calls;
  }

  static v1::Response Allreduce(std::vector<std::string> names, std::vector<int64_t> sizes) {
    v1::Response r;
    r.set_type(v1::Response::TYPE_ALLREDUCE);
    r.set_dtype(v1::DATA_TYPE_FLOAT32);
    r.set_reduce_op(v1::REDUCE_OP_AVERAGE);
    for (auto& n : names) r.add_names(n);
    for (int64_t s : sizes) r.add_tensor_sizes(s);
    return r;
  }
  // A list that gives `name` the cache id `id` and allreduces it (`size` elements).
  static v1::ResponseList AssignAndAllreduce(const std::string& name, uint32_t id, int64_t size) {
    v1::ResponseList list;
    v1::CacheAssignment* assigned = list.add_cache_assignments();
    assigned->set_name(name);
    assigned->set_id(id);
    *list.add_responses() = Allreduce({name}, {size});
    return list;
  }
  void Respond(v1::Response r) {
    v1::ResponseList list;
    *list.add_responses() = std::move(r);
    Deliver(list);
  }

  FakeExecutor::State executor_;
  FakeClock clock_;
  absl::Mutex mu_;
  std::vector<v1::WorkerMessage> sent_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, v1::LocalCompletion> completions_ ABSL_GUARDED_BY(mu_);
  // Last: stopping it completes what is pending, into the members above.
  std::unique_ptr<Engine> engine_;
};

TEST_F(EngineTest, TensorsEnqueuedWithinACycleTravelInOneBatchWhenItEnds) {
  Start(/*cycle=*/absl::Hours(1));                      // on the fake clock: only Advance ends it
  Enqueue(1, "a", v1::REQUEST_TYPE_ALLREDUCE, {4}, 0);  // goes at once: no batch sent yet
  EXPECT_THAT(Batches(1), ElementsAre("a|"));
  Enqueue(2, "b", v1::REQUEST_TYPE_ALLREDUCE, {4}, 64);
  Enqueue(3, "c", v1::REQUEST_TYPE_ALLREDUCE, {4}, 128);
  // Several polls of the clock later, the cycle has not ended: nothing more was sent.
  absl::SleepFor(3 * Engine::kClockPoll);
  EXPECT_THAT(Batches(1), ElementsAre("a|"));
  clock_.Advance(absl::Minutes(59));
  absl::SleepFor(3 * Engine::kClockPoll);
  EXPECT_THAT(Batches(1), ElementsAre("a|"));
  clock_.Advance(absl::Minutes(1));
  EXPECT_THAT(Batches(2), ElementsAre("a|", "b,c|"));  // together, once the cycle is over
}

TEST_F(EngineTest, ARequestGoesAtOnceWhenNothingSentAwaitsItsResponse) {
  Start(/*cycle=*/absl::Hours(1));  // on the fake clock: only Advance ends it
  Enqueue(1, "a", v1::REQUEST_TYPE_ALLREDUCE, {4}, 0);
  EXPECT_THAT(Batches(1), ElementsAre("a|"));
  Respond(Allreduce({"a"}, {4}));
  EXPECT_EQ(WaitFor(1).code(), 0);
  // Within the same cycle, but nothing sent awaits its response (a small collective in a loop):
  // there is nothing to fuse with on its way, so it goes at once.
  Enqueue(2, "b", v1::REQUEST_TYPE_ALLREDUCE, {4}, 0);
  EXPECT_THAT(Batches(2), ElementsAre("a|", "b|"));
  // While b awaits its response, c waits for the cycle to end (to travel with what follows).
  Enqueue(3, "c", v1::REQUEST_TYPE_ALLREDUCE, {4}, 64);
  absl::SleepFor(3 * Engine::kClockPoll);
  EXPECT_THAT(Batches(2), ElementsAre("a|", "b|"));
  clock_.Advance(absl::Hours(1));
  EXPECT_THAT(Batches(3), ElementsAre("a|", "b|", "c|"));
}

TEST_F(EngineTest, AFusedResponseBecomesOneCollectiveInItsOrderWithJoinedTensorsEmpty) {
  Start();
  Enqueue(1, "a", v1::REQUEST_TYPE_ALLREDUCE, {2, 2}, 0, /*ready_event=*/3);
  Enqueue(2, "b", v1::REQUEST_TYPE_ALLREDUCE, {8}, 256, 4);
  v1::Response r = Allreduce({"b", "gone", "a"}, {8, 6, 4});  // "gone": not on this rank
  r.set_prescale_factor(0.5);
  Respond(r);
  const v1::LocalCompletion a = WaitFor(1), b = WaitFor(2);
  EXPECT_EQ(a.code(), 0) << a.message();
  EXPECT_EQ(a.handle(), 1u);
  EXPECT_EQ(b.handle(), 2u);
  EXPECT_EQ(a.done_event(), 5);
  EXPECT_THAT(Calls(), ElementsAre("allreduce dtype=7 op=1 pre=0.5 post=1 root=0 sizes=8/6/4 "
                                   "[256 e4 8] [-1 e0 ] [0 e3 2x2]"));
}

TEST_F(EngineTest, CachedTensorsTravelByIdAndResponsesByIdFindThem) {
  Start(/*cycle=*/absl::Milliseconds(1));
  Enqueue(1, "w", v1::REQUEST_TYPE_ALLREDUCE, {4}, 0);
  EXPECT_THAT(Batches(1), ElementsAre("w|"));
  Deliver(AssignAndAllreduce("w", 9, 4));
  EXPECT_EQ(WaitFor(1).code(), 0);
  // The same tensor again: by its id; and the response may name it by id alone.
  clock_.Advance(absl::Milliseconds(1));  // a cycle later
  Enqueue(2, "w", v1::REQUEST_TYPE_ALLREDUCE, {4}, 0);
  EXPECT_THAT(Batches(2), ElementsAre("w|", "|#9"));
  v1::Response by_id = Allreduce({}, {4});
  by_id.add_cache_ids(9);
  Respond(by_id);
  EXPECT_EQ(WaitFor(2).code(), 0);
  // The coordinator lost it (restart, eviction): asked to re-send, the rank sends the request.
  clock_.Advance(absl::Milliseconds(1));  // a cycle later
  Enqueue(3, "w", v1::REQUEST_TYPE_ALLREDUCE, {4}, 0);
  EXPECT_THAT(Batches(3), ElementsAre("w|", "|#9", "|#9"));
  v1::ResponseList resend;
  resend.add_resend_ids(9);
  Deliver(resend);
  EXPECT_THAT(Batches(4), ElementsAre("w|", "|#9", "|#9", "w|"));
}

TEST_F(EngineTest, AResendOfAnIdEvictedMeanwhileStillSendsTheRequest) {
  Start(/*cycle=*/absl::Milliseconds(1));
  Enqueue(1, "w", v1::REQUEST_TYPE_ALLREDUCE, {4}, 0);
  EXPECT_THAT(Batches(1), ElementsAre("w|"));
  Deliver(AssignAndAllreduce("w", 9, 4));
  EXPECT_EQ(WaitFor(1).code(), 0);
  clock_.Advance(absl::Milliseconds(1));
  Enqueue(2, "w", v1::REQUEST_TYPE_ALLREDUCE, {4}, 0);
  EXPECT_THAT(Batches(2), ElementsAre("w|", "|#9"));
  // The coordinator dropped its cache (autotune turned it off) while #9 was on its way: the
  // eviction and then the request for the full tensor arrive, in one list or in two.
  v1::ResponseList evicted;
  evicted.add_evicted_ids(9);
  Deliver(evicted);
  v1::ResponseList resend;
  resend.add_resend_ids(9);
  Deliver(resend);
  EXPECT_THAT(Batches(3), ElementsAre("w|", "|#9", "w|"));
  Respond(Allreduce({"w"}, {4}));
  EXPECT_EQ(WaitFor(2).code(), 0);
}

TEST_F(EngineTest, ANewCacheGenerationSendsEveryUnansweredRequestAgainInFull) {
  Start(/*cycle=*/absl::Hours(1));  // on the fake clock: a batch goes when Advance ends a cycle
  Enqueue(1, "w", v1::REQUEST_TYPE_ALLREDUCE, {4}, 0);
  EXPECT_THAT(Batches(1), ElementsAre("w|"));
  Deliver(AssignAndAllreduce("w", 9, 4));
  EXPECT_EQ(WaitFor(1).code(), 0);
  // Two requests out (w by its cache id), unanswered when the coordinator restarts: in one batch,
  // or in two when the engine sent w at once (nothing else in flight) before v was enqueued.
  Enqueue(2, "w", v1::REQUEST_TYPE_ALLREDUCE, {4}, 0);
  Enqueue(3, "v", v1::REQUEST_TYPE_ALLREDUCE, {4}, 64);
  clock_.Advance(absl::Hours(1));
  std::vector<std::string> out = Batches(2);
  if (out.size() == 2 && out[1] == "|#9") out = Batches(3);
  ASSERT_THAT(out, AnyOf(ElementsAre("w|", "v|#9"), ElementsAre("w|", "|#9", "v|")));
  const size_t before = out.size();
  {
    absl::MutexLock lock(&mu_);
    for (const v1::WorkerMessage& m : sent_) {
      if (m.has_requests()) {
        EXPECT_EQ(m.requests().cache_generation(), 0u);
      }
    }
  }
  // The restarted coordinator's first list: a new generation, nothing else. Both go again, in
  // full (the old cache ids mean nothing to it), in the order they were enqueued, and say so.
  v1::ResponseList first;
  first.set_cache_generation(77);
  Deliver(first);
  out = Batches(before + 1);
  ASSERT_EQ(out.size(), before + 1);
  EXPECT_EQ(out.back(), "w,v|");
  {
    absl::MutexLock lock(&mu_);
    EXPECT_EQ(sent_.back().requests().cache_generation(), 77u);
  }
  // Answered in the new generation, they complete.
  v1::ResponseList answer;
  answer.set_cache_generation(77);
  *answer.add_responses() = Allreduce({"w", "v"}, {4, 4});
  Deliver(answer);
  EXPECT_EQ(WaitFor(2).code(), 0);
  EXPECT_EQ(WaitFor(3).code(), 0);
  // The old id is gone with the old cache: the next request of w goes in full.
  Enqueue(4, "w", v1::REQUEST_TYPE_ALLREDUCE, {4}, 0);
  clock_.Advance(absl::Hours(1));
  out = Batches(before + 2);
  ASSERT_EQ(out.size(), before + 2);
  EXPECT_EQ(out.back(), "w|");
}

TEST_F(EngineTest, ANegotiationErrorFailsExactlyTheTensorsItNames) {
  Start();
  Enqueue(1, "a", v1::REQUEST_TYPE_ALLREDUCE, {4}, 0);
  Enqueue(2, "b", v1::REQUEST_TYPE_ALLREDUCE, {4}, 64);
  v1::ResponseList list;
  v1::Response* error = list.add_rank_errors();
  error->add_names("a");
  error->set_error_message("Mismatched shapes for tensor 'a': rank 0 has [4], rank 1 has [5]");
  Deliver(list);
  const v1::LocalCompletion a = WaitFor(1);
  EXPECT_EQ(a.code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(a.message(), "Mismatched shapes for tensor 'a': rank 0 has [4], rank 1 has [5]");
  EXPECT_FALSE(Completed(2));
  Respond(Allreduce({"b"}, {4}));
  EXPECT_EQ(WaitFor(2).code(), 0);
}

TEST_F(EngineTest, AFatalFailureFailsEverythingElseAndAbortsTheExecutor) {
  Start();
  {
    absl::MutexLock lock(&executor_.mu);
    executor_.fail = absl::UnavailableError("gloo allreduce: connection to rank 0 closed");
  }
  Enqueue(1, "a", v1::REQUEST_TYPE_ALLREDUCE, {4}, 0);
  Enqueue(2, "waiting", v1::REQUEST_TYPE_ALLREDUCE, {4}, 64);
  Respond(Allreduce({"a"}, {4}));
  EXPECT_EQ(WaitFor(1).message(), "gloo allreduce: connection to rank 0 closed");
  const v1::LocalCompletion waiting = WaitFor(2);
  EXPECT_EQ(waiting.code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_EQ(waiting.message(), "gloo allreduce: connection to rank 0 closed");
  Enqueue(3, "later", v1::REQUEST_TYPE_ALLREDUCE, {4}, 128);
  EXPECT_EQ(WaitFor(3).message(), "gloo allreduce: connection to rank 0 closed");
  absl::MutexLock lock(&executor_.mu);
  EXPECT_THAT(executor_.aborts, ElementsAre("gloo allreduce: connection to rank 0 closed"));
}

TEST_F(EngineTest, AFailureTheExecutorSurvivesFailsOnlyItsOwnTensors) {
  Start();
  {
    absl::MutexLock lock(&executor_.mu);
    executor_.fail =
        absl::InvalidArgumentError("allgather response has 1 sizes for 1 tensors on 2 ranks");
    executor_.fatal = false;
  }
  Enqueue(1, "g", v1::REQUEST_TYPE_ALLGATHER, {4}, 0);
  Enqueue(2, "b", v1::REQUEST_TYPE_ALLREDUCE, {4}, 64);
  v1::Response g;
  g.set_type(v1::Response::TYPE_ALLGATHER);
  g.set_dtype(v1::DATA_TYPE_FLOAT32);
  g.add_names("g");
  g.add_tensor_sizes(4);
  Respond(g);
  EXPECT_EQ(WaitFor(1).code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  {
    absl::MutexLock lock(&executor_.mu);
    executor_.fail = absl::OkStatus();
  }
  Respond(Allreduce({"b"}, {4}));
  EXPECT_EQ(WaitFor(2).code(), 0);
}

// A response of a type this worker does not know (a coordinator of a newer release) reached no
// communicator: it fails its own tensors alone, and the next collective works.
TEST_F(EngineTest, AResponseOfAnUnknownTypeFailsOnlyItsTensors) {
  Start();
  Enqueue(1, "new.kind", v1::REQUEST_TYPE_ALLREDUCE, {4}, 0);
  Enqueue(2, "b", v1::REQUEST_TYPE_ALLREDUCE, {4}, 64);
  v1::Response unknown = Allreduce({"new.kind"}, {4});
  unknown.set_type(static_cast<v1::Response::Type>(42));
  Respond(unknown);
  const v1::LocalCompletion failed = WaitFor(1);
  EXPECT_EQ(failed.code(), static_cast<int>(absl::StatusCode::kInternal));
  EXPECT_EQ(failed.message(), "unknown response type 42");
  Respond(Allreduce({"b"}, {4}));
  EXPECT_EQ(WaitFor(2).code(), 0);
  absl::MutexLock lock(&executor_.mu);
  EXPECT_THAT(executor_.aborts, IsEmpty());
}

TEST_F(EngineTest, AllgatherOutputsReachTheirCompletions) {
  Start();
  Enqueue(1, "g0", v1::REQUEST_TYPE_ALLGATHER, {1, 3}, 0);
  Enqueue(2, "g1", v1::REQUEST_TYPE_ALLGATHER, {2, 3}, 64);
  v1::Response g;
  g.set_type(v1::Response::TYPE_ALLGATHER);
  g.set_dtype(v1::DATA_TYPE_FLOAT32);
  g.add_names("g0");
  g.add_names("g1");
  for (int64_t s : {1, 1, 1, 2}) g.add_tensor_sizes(s);
  g.add_row_elements(3);
  g.add_row_elements(3);
  Respond(g);
  const v1::LocalCompletion g0 = WaitFor(1), g1 = WaitFor(2);
  EXPECT_EQ(g0.output_offset(), 1000);
  EXPECT_THAT(g0.output_shape(), ElementsAre(2, 3));
  EXPECT_EQ(g1.output_offset(), 1001);
  EXPECT_THAT(g1.output_shape(), ElementsAre(3, 3));
  EXPECT_THAT(Calls(), ElementsAre("allgather dtype=7 op=0 pre=1 post=1 root=0 sizes=1/1/1/2 "
                                   "[0 e0 1x3] [64 e0 2x3]"));
}

TEST_F(EngineTest, JoinCompletesWithTheLastJoinedRank) {
  Start();
  Enqueue(1, "join.1", v1::REQUEST_TYPE_JOIN, {}, 0);
  v1::Response join;
  join.set_type(v1::Response::TYPE_JOIN);
  join.set_last_joined_rank(1);
  Respond(join);
  const v1::LocalCompletion c = WaitFor(1);
  EXPECT_EQ(c.code(), 0);
  EXPECT_EQ(c.last_joined_rank(), 1);
  EXPECT_TRUE(Calls().empty());  // no collective for a join
}

// Horovod's remove_process_set: after the job's barrier named for the set completes, the executor
// releases the set's communicators; an ordinary barrier releases nothing.
TEST_F(EngineTest, TheReleaseBarrierOfAProcessSetReleasesItsCommunicatorsOnceItCompletes) {
  Start();
  Enqueue(1, "barrier.1", v1::REQUEST_TYPE_BARRIER, {}, 0);
  Enqueue(2, "process_set.release.7", v1::REQUEST_TYPE_BARRIER, {}, 0);
  for (const char* name : {"barrier.1", "process_set.release.7"}) {
    v1::Response b;
    b.set_type(v1::Response::TYPE_BARRIER);
    b.add_names(name);
    Respond(b);
  }
  EXPECT_EQ(WaitFor(1).code(), 0);
  EXPECT_EQ(WaitFor(2).code(), 0);
  EXPECT_THAT(Calls(), ElementsAre(StartsWith("barrier"), StartsWith("barrier"), "release set 7"));
}

TEST_F(EngineTest, OperationsPastTheInFlightBoundAreRefusedUntilSomeComplete) {
  Start(absl::Milliseconds(1), /*max_in_flight=*/2);
  Enqueue(1, "a", v1::REQUEST_TYPE_ALLREDUCE, {4}, 0);
  Enqueue(2, "b", v1::REQUEST_TYPE_ALLREDUCE, {4}, 64);
  Enqueue(3, "c", v1::REQUEST_TYPE_ALLREDUCE, {4}, 128);
  const v1::LocalCompletion refused = WaitFor(3);
  EXPECT_EQ(refused.code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(refused.message(),
            "tensor 'c': rank 1 (host-b) has 2 operations in flight, the most a training process "
            "may have at once: wait for some (synchronize) before enqueueing more");
  EXPECT_FALSE(Completed(1));
  Respond(Allreduce({"a"}, {4}));
  EXPECT_EQ(WaitFor(1).code(), 0);
  Enqueue(4, "c", v1::REQUEST_TYPE_ALLREDUCE, {4}, 128);  // room again
  Respond(Allreduce({"b", "c"}, {4, 4}));
  EXPECT_EQ(WaitFor(2).code(), 0);
  EXPECT_EQ(WaitFor(4).code(), 0);
}

TEST_F(EngineTest, BadEnqueuesAreRefusedAtOnceNamingTheTensor) {
  Start();
  Enqueue(1, "far", v1::REQUEST_TYPE_ALLREDUCE, {16}, (1 << 16) - 32);
  EXPECT_EQ(WaitFor(1).message(),
            "tensor 'far': 64 bytes at arena offset 65504 lie outside the 65536-byte arena");
  Enqueue(2, "twice", v1::REQUEST_TYPE_ALLREDUCE, {4}, 0);
  Enqueue(3, "twice", v1::REQUEST_TYPE_ALLREDUCE, {4}, 64);
  EXPECT_EQ(WaitFor(3).message(),
            "Tensor 'twice' is already in flight on rank 1 (host-b): wait for it to complete "
            "before submitting it again, or use a different name.");
  EXPECT_FALSE(Completed(2));
}

TEST_F(EngineTest, ACommunicatorThatCannotBeSetUpFailsEveryOperation) {
  {
    absl::MutexLock lock(&executor_.mu);
    executor_.setup = absl::DeadlineExceededError("gloo rendezvous timed out after 30s");
  }
  Start();
  Enqueue(1, "a", v1::REQUEST_TYPE_ALLREDUCE, {4}, 0);
  const v1::LocalCompletion c = WaitFor(1);
  EXPECT_EQ(c.code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_EQ(c.message(),
            "communicator setup failed on rank 1 (host-b): gloo rendezvous timed out after 30s");
}

TEST_F(EngineTest, StopFailsWhatIsPendingAsCancelled) {
  Start();
  Enqueue(1, "a", v1::REQUEST_TYPE_ALLREDUCE, {4}, 0);
  engine_->Stop();
  const v1::LocalCompletion c = WaitFor(1);
  EXPECT_EQ(c.code(), static_cast<int>(absl::StatusCode::kCancelled));
  EXPECT_EQ(c.message(), "job job-000003 stopped on rank 1 (host-b)");
}

TEST_F(EngineTest, AStopDuringASetupThatCannotBeCancelledReturnsInTimeAndAbortsWhatIsPending) {
  absl::Notification release;
  executor_.hold_setup = &release;
  Start();
  Enqueue(1, "grad", v1::REQUEST_TYPE_ALLREDUCE, {4}, 0);
  const absl::Time asked = absl::Now();
  EXPECT_FALSE(engine_->StopWithin(absl::Milliseconds(100)));
  EXPECT_GE(absl::Now() - asked, absl::Milliseconds(100));
  EXPECT_LT(absl::Now() - asked, absl::Seconds(2));
  // What was pending failed at once, with the stop's reason.
  v1::LocalCompletion c = WaitFor(1);
  EXPECT_EQ(c.code(), static_cast<int>(absl::StatusCode::kCancelled));
  EXPECT_EQ(c.message(), "job job-000003 stopped on rank 1 (host-b)");
  // Once the setup gives up, a stop joins the thread.
  release.Notify();
  EXPECT_TRUE(engine_->StopWithin(absl::Seconds(10)));
  engine_->Stop();  // again: a no-op
}

}  // namespace
}  // namespace ringmaster
