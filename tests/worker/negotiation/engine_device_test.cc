// The engine's GPU side through its contract with the device executor, with a fake executor (no
// CUDA): which tensors reach the device with which ready events, the done event every completion
// carries, allgather outputs (and their release on failure), and that any device failure is fatal
// for the rank (NCCL matches calls by order: a rank that skipped one would be out of step).
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "common/negotiation_wire.h"
#include "common/shared_memory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/gpu/gpu_executor.h"
#include "worker/negotiation/engine.h"
#include "worker/negotiation/engine_wire.h"

namespace ringmaster {
namespace {

using ::testing::ElementsAre;

class FakeDevice : public DeviceExecutor {
 public:
  absl::Status Setup() override {
    ++setups;
    return setup_status;
  }
  absl::Status OpenReadyEvents(const std::vector<std::string>&) override {
    return absl::OkStatus();
  }
  absl::Status UseProcessSet(int32_t id, const std::vector<int32_t>& ranks) override {
    absl::MutexLock lock(&mu);
    if (!ranks.empty())
      calls.push_back(absl::StrCat("set ", id, " [", absl::StrJoin(ranks, ","), "]"));
    return absl::OkStatus();
  }
  void ReleaseProcessSet(int32_t id) override {
    absl::MutexLock lock(&mu);
    calls.push_back(absl::StrCat("release ", id));
  }
  absl::StatusOr<int32_t> Allreduce(const std::vector<Tensor>& tensors, DataType dtype, ReduceOp op,
                                    double prescale, double postscale) override {
    absl::MutexLock lock(&mu);
    std::string call =
        absl::StrCat("allreduce op=", static_cast<int>(op), " pre=", prescale, " post=", postscale);
    for (const Tensor& t : tensors) {
      absl::StrAppend(&call, " [", t.offset, ",", t.count, ",e", t.ready_event, "]");
    }
    calls.push_back(call);
    if (!fail.ok()) return fail;
    return next_done++;
  }
  absl::StatusOr<int32_t> Broadcast(const Tensor& t, int64_t bytes, int root) override {
    absl::MutexLock lock(&mu);
    calls.push_back(absl::StrCat("broadcast [", t.offset, ",e", t.ready_event, "] bytes=", bytes,
                                 " root=", root));
    if (!fail.ok()) return fail;
    return next_done++;
  }
  absl::StatusOr<int32_t> Allgather(const Tensor& in, int64_t out_offset,
                                    const std::vector<int64_t>& bytes) override {
    absl::MutexLock lock(&mu);
    calls.push_back(absl::StrCat("allgather [", in.offset, "] out=", out_offset,
                                 " bytes=", absl::StrJoin(bytes, "/")));
    if (allgathers_ok-- > 0) return next_done++;
    return absl::UnavailableError("NCCL allgather on rank 0 failed: peer gone");
  }
  absl::Status Barrier() override {
    absl::MutexLock lock(&mu);
    calls.push_back("barrier");
    return absl::OkStatus();
  }
  void Abort(const std::string& why) override {
    absl::MutexLock lock(&mu);
    aborts.push_back(why);
  }

  absl::Mutex mu;
  std::vector<std::string> calls;
  std::vector<std::string> aborts;
  absl::Status setup_status;
  absl::Status fail;
  int allgathers_ok = 1 << 20;
  int32_t next_done = 7;
  int setups = 0;
};

class EngineDeviceTest : public ::testing::Test {
 protected:
  void Start(int rank = 0, int size = 2) {
    EngineOptions o;
    o.job_id = "job-000001";
    o.epoch = 1;
    o.rank = rank;
    o.size = size;
    o.host = "host-a";
    o.arena_bytes = arena_.size();
    o.cycle_time = absl::Milliseconds(1);
    o.executor = std::make_unique<GpuExecutor>(&device_, &outputs_, rank, size);
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

  // Enqueues a tensor at `offset`; its completion lands in completions_[handle].
  void Enqueue(uint64_t handle, const std::string& name, v1::RequestType type,
               std::vector<int64_t> shape, int64_t offset, int32_t ready_event) {
    v1::LocalEnqueue e;
    e.set_handle(handle);
    e.set_offset(offset);
    e.set_ready_event(ready_event);
    v1::TensorRequest* r = e.mutable_request();
    r->set_name(name);
    r->set_type(type);
    r->set_dtype(v1::DATA_TYPE_FLOAT32);
    for (int64_t d : shape) r->add_shape(d);
    // As the daemon does: the engine's completion is matched to its handle by the caller.
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
    EXPECT_TRUE(mu_.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(10)));
    return completions_.contains(handle) ? completions_[handle] : v1::LocalCompletion();
  }

  std::vector<uint8_t> arena_ = std::vector<uint8_t>(1 << 20);
  ArenaAllocator outputs_{1 << 19, 1 << 20};
  FakeDevice device_;
  absl::Mutex mu_;
  std::vector<v1::WorkerMessage> sent_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, v1::LocalCompletion> completions_ ABSL_GUARDED_BY(mu_);
  // Last: stopping it completes what is pending, into the members above.
  std::unique_ptr<Engine> engine_;
};

v1::Response Allreduce(std::vector<std::string> names, std::vector<int64_t> sizes) {
  v1::Response r;
  r.set_type(v1::Response::TYPE_ALLREDUCE);
  r.set_dtype(v1::DATA_TYPE_FLOAT32);
  r.set_reduce_op(v1::REDUCE_OP_SUM);
  r.set_prescale_factor(2);
  r.set_postscale_factor(0.5);
  for (auto& n : names) r.add_names(n);
  for (int64_t s : sizes) r.add_tensor_sizes(s);
  return r;
}

TEST_F(EngineDeviceTest, AFusedAllreduceReachesTheDeviceWithEveryTensorsReadyEvent) {
  Start();
  Enqueue(1, "a", v1::REQUEST_TYPE_ALLREDUCE, {100}, 0, 3);
  Enqueue(2, "b", v1::REQUEST_TYPE_ALLREDUCE, {50}, 4096, 4);
  v1::ResponseList list;
  *list.add_responses() = Allreduce({"a", "b"}, {100, 50});
  Deliver(list);
  const v1::LocalCompletion a = WaitFor(1), b = WaitFor(2);
  EXPECT_EQ(a.code(), 0) << a.message();
  EXPECT_EQ(a.done_event(), 7);  // what the device recorded, for the client's stream to wait on
  EXPECT_EQ(b.done_event(), 7);
  absl::MutexLock lock(&device_.mu);
  EXPECT_EQ(device_.setups, 1);
  EXPECT_THAT(device_.calls, ElementsAre("allreduce op=2 pre=2 post=0.5 [0,100,e3] [4096,50,e4]"));
}

TEST_F(EngineDeviceTest, BroadcastAndAllgatherGoToTheDeviceWithTheirOutputs) {
  Start(/*rank=*/1, /*size=*/2);
  Enqueue(1, "w", v1::REQUEST_TYPE_BROADCAST, {16}, 256, 1);
  Enqueue(2, "g", v1::REQUEST_TYPE_ALLGATHER, {3, 4}, 512, 2);
  v1::ResponseList list;
  v1::Response* bc = list.add_responses();
  bc->set_type(v1::Response::TYPE_BROADCAST);
  bc->set_dtype(v1::DATA_TYPE_FLOAT32);
  bc->add_names("w");
  bc->add_tensor_sizes(16);
  bc->set_root_rank(0);
  v1::Response* ag = list.add_responses();
  ag->set_type(v1::Response::TYPE_ALLGATHER);
  ag->set_dtype(v1::DATA_TYPE_FLOAT32);
  ag->add_names("g");
  ag->add_tensor_sizes(2);  // rank 0: 2 rows
  ag->add_tensor_sizes(3);  // rank 1 (this one): 3 rows
  ag->add_row_elements(4);
  Deliver(list);
  EXPECT_EQ(WaitFor(1).done_event(), 7);
  const v1::LocalCompletion g = WaitFor(2);
  EXPECT_EQ(g.code(), 0) << g.message();
  EXPECT_EQ(g.done_event(), 8);
  EXPECT_THAT(g.output_shape(), ElementsAre(5, 4));
  absl::MutexLock lock(&device_.mu);
  EXPECT_THAT(device_.calls,
              ElementsAre("broadcast [256,e1] bytes=64 root=0",
                          absl::StrCat("allgather [512] out=", g.output_offset(), " bytes=32/48")));
}

TEST_F(EngineDeviceTest, AProcessSetsCollectivesRunOnItsCommunicatorWithRootsAndPartsByPlace) {
  Start(/*rank=*/2, /*size=*/4);
  Enqueue(1, "w", v1::REQUEST_TYPE_BROADCAST, {16}, 256, 1);
  Enqueue(2, "g", v1::REQUEST_TYPE_ALLGATHER, {3, 4}, 512, 2);
  Enqueue(3, "a", v1::REQUEST_TYPE_ALLREDUCE, {10}, 1024, 3);
  v1::ResponseList list;
  v1::Response* bc = list.add_responses();
  bc->set_type(v1::Response::TYPE_BROADCAST);
  bc->set_dtype(v1::DATA_TYPE_FLOAT32);
  bc->add_names("w");
  bc->add_tensor_sizes(16);
  bc->set_root_rank(3);  // job rank 3: the set's third member
  bc->set_process_set_id(5);
  for (int r : {0, 2, 3}) bc->add_process_set_ranks(r);
  v1::Response* ag = list.add_responses();
  ag->set_type(v1::Response::TYPE_ALLGATHER);
  ag->set_dtype(v1::DATA_TYPE_FLOAT32);
  ag->add_names("g");
  for (int rows : {1, 3, 2}) ag->add_tensor_sizes(rows);  // per member: ranks 0, 2 (this), 3
  ag->add_row_elements(4);
  ag->set_process_set_id(5);
  for (int r : {0, 2, 3}) ag->add_process_set_ranks(r);
  *list.add_responses() = Allreduce({"a"}, {10});  // the job's set again
  Deliver(list);
  EXPECT_EQ(WaitFor(1).code(), 0);
  const v1::LocalCompletion g = WaitFor(2);
  EXPECT_EQ(g.code(), 0) << g.message();
  EXPECT_THAT(g.output_shape(), ElementsAre(6, 4));
  EXPECT_EQ(WaitFor(3).code(), 0);
  absl::MutexLock lock(&device_.mu);
  EXPECT_THAT(
      device_.calls,
      ElementsAre("set 5 [0,2,3]", "broadcast [256,e1] bytes=64 root=2", "set 5 [0,2,3]",
                  absl::StrCat("allgather [512] out=", g.output_offset(), " bytes=16/48/32"),
                  "allreduce op=2 pre=2 post=0.5 [1024,10,e3]"));
}

TEST_F(EngineDeviceTest, ADeviceFailureFailsTheOpsAndAbortsTheRank) {
  Start();
  device_.fail =
      absl::UnavailableError("NCCL allreduce on rank 0 (host-a, cuda:0) failed: peer gone");
  Enqueue(1, "a", v1::REQUEST_TYPE_ALLREDUCE, {10}, 0, 1);
  Enqueue(2, "later", v1::REQUEST_TYPE_ALLREDUCE, {10}, 1024, 2);
  v1::ResponseList list;
  *list.add_responses() = Allreduce({"a"}, {10});
  Deliver(list);
  EXPECT_EQ(WaitFor(1).code(), static_cast<int>(absl::StatusCode::kUnavailable));
  // The rank is out of the job: the op still waiting fails too, and the communicator is aborted.
  EXPECT_EQ(WaitFor(2).code(), static_cast<int>(absl::StatusCode::kUnavailable));
  absl::MutexLock lock(&device_.mu);
  ASSERT_FALSE(device_.aborts.empty());
  EXPECT_THAT(device_.aborts[0], ::testing::HasSubstr("peer gone"));
}

TEST_F(EngineDeviceTest, AFailedAllgatherReturnsEarlierOutputsToTheArena) {
  Start(0, 1);
  const size_t free_before = outputs_.free_bytes();
  device_.allgathers_ok = 1;  // the first tensor's allgather works, the second's fails
  Enqueue(1, "g1", v1::REQUEST_TYPE_ALLGATHER, {4}, 0, 0);
  Enqueue(2, "g2", v1::REQUEST_TYPE_ALLGATHER, {4}, 64, 0);
  v1::ResponseList list;
  v1::Response* ag = list.add_responses();
  ag->set_type(v1::Response::TYPE_ALLGATHER);
  ag->set_dtype(v1::DATA_TYPE_FLOAT32);
  ag->add_names("g1");
  ag->add_names("g2");
  ag->add_tensor_sizes(4);
  ag->add_tensor_sizes(4);
  ag->add_row_elements(1);
  ag->add_row_elements(1);
  Deliver(list);
  EXPECT_EQ(WaitFor(1).code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_EQ(WaitFor(2).code(), static_cast<int>(absl::StatusCode::kUnavailable));
  engine_->Stop();
  EXPECT_EQ(outputs_.free_bytes(), free_before);
}

// An allgather output that does not fit this rank's arena fails that allgather alone: the rank
// still makes the NCCL call its peers make (into scratch), so the next collective works.
TEST_F(EngineDeviceTest, AnAllgatherOutputThatDoesNotFitTheArenaFailsOnlyItself) {
  Start(0, 2);
  const size_t free_before = outputs_.free_bytes();
  Enqueue(1, "g", v1::REQUEST_TYPE_ALLGATHER, {4}, 0, 0);
  Enqueue(2, "later", v1::REQUEST_TYPE_ALLREDUCE, {10}, 1024, 3);
  v1::ResponseList list;
  v1::Response* ag = list.add_responses();
  ag->set_type(v1::Response::TYPE_ALLGATHER);
  ag->set_dtype(v1::DATA_TYPE_FLOAT32);
  ag->add_names("g");
  ag->add_tensor_sizes(4);
  ag->add_tensor_sizes(1 << 20);  // the peer's 4 MiB: more than this arena's outputs
  ag->add_row_elements(1);
  *list.add_responses() = Allreduce({"later"}, {10});
  Deliver(list);
  const v1::LocalCompletion failed = WaitFor(1);
  EXPECT_EQ(failed.code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(failed.message(),
            "the allgather's output of 4194320 bytes does not fit the shared arena (shared arena "
            "full: 4194320 bytes requested, 524288 free): start the workers with a larger "
            "--arena-mb (ringmaster local --arena-mb), or gather less at once");
  EXPECT_EQ(WaitFor(2).code(), 0);
  {
    absl::MutexLock lock(&device_.mu);
    EXPECT_THAT(device_.calls, ElementsAre("allgather [0] out=-1 bytes=16/4194304",
                                           "allreduce op=2 pre=2 post=0.5 [1024,10,e3]"));
    EXPECT_TRUE(device_.aborts.empty());
  }
  engine_->Stop();
  EXPECT_EQ(outputs_.free_bytes(), free_before);
}

TEST_F(EngineDeviceTest, ACommunicatorThatCannotBeSetUpFailsEveryOperation) {
  device_.setup_status = absl::DeadlineExceededError("NCCL communicator setup timed out");
  Start();
  Enqueue(1, "a", v1::REQUEST_TYPE_ALLREDUCE, {10}, 0, 1);
  const v1::LocalCompletion c = WaitFor(1);
  EXPECT_EQ(c.code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_THAT(c.message(), ::testing::HasSubstr("NCCL communicator setup timed out"));
}

}  // namespace
}  // namespace ringmaster
