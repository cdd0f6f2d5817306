// The daemon's edges around the engine: the local socket's enqueue and completion, and the
// session's response lists and request batches, converted to and from the engine's own types
// without losing a field.
#include "worker/negotiation/engine_wire.h"

#include "common/negotiation_wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster {
namespace {

using ::testing::ElementsAre;

TEST(EngineWireTest, AnEnqueueKeepsItsHandleRequestOffsetAndEvent) {
  v1::LocalEnqueue in;
  in.set_handle(42);
  in.set_offset(4096);
  in.set_ready_event(3);
  v1::TensorRequest* r = in.mutable_request();
  r->set_name("grad/conv1");
  r->set_type(v1::REQUEST_TYPE_BROADCAST);
  r->set_dtype(v1::DATA_TYPE_FLOAT16);
  r->add_shape(2);
  r->add_shape(5);
  r->set_root_rank(1);
  r->set_reduce_op(v1::REDUCE_OP_SUM);
  r->set_prescale_factor(0.5);
  r->set_postscale_factor(4);
  r->set_device(-1);
  r->set_group_id(7);
  r->set_group_size(3);
  LocalOp op;
  FromProto(in, &op);
  EXPECT_EQ(op.handle, 42u);
  EXPECT_EQ(op.offset, 4096);
  EXPECT_EQ(op.ready_event, 3);
  EXPECT_EQ(op.request.name, "grad/conv1");
  EXPECT_EQ(op.request.type, RequestType::kBroadcast);
  EXPECT_EQ(op.request.dtype, DataType::kFloat16);
  EXPECT_THAT(op.request.shape, ElementsAre(2, 5));
  EXPECT_EQ(op.request.root_rank, 1);
  EXPECT_EQ(op.request.reduce_op, ReduceOp::kSum);
  EXPECT_EQ(op.request.prescale_factor, 0.5);
  EXPECT_EQ(op.request.postscale_factor, 4);
  EXPECT_EQ(op.request.group_id, 7);
  EXPECT_EQ(op.request.group_size, 3);

  // And back, as a request batch carries it.
  RequestBatch batch;
  batch.job_id = "job-000009";
  batch.epoch = 3;
  batch.rank = 1;
  batch.cache_generation = 2;
  batch.requests.push_back(op.request);
  batch.cached_ids = {4, 8};
  batch.used_ids = {3};
  v1::RequestBatch wire;
  ToProto(batch, &wire);
  EXPECT_THAT(wire.used_ids(), ElementsAre(3));
  RequestBatch back;
  FromProto(wire, &back);
  EXPECT_THAT(back.used_ids, ElementsAre(3u));
  EXPECT_EQ(wire.job_id(), "job-000009");
  EXPECT_EQ(wire.epoch(), 3);
  EXPECT_EQ(wire.rank(), 1);
  EXPECT_EQ(wire.cache_generation(), 2u);
  EXPECT_THAT(wire.cached_ids(), ElementsAre(4, 8));
  ASSERT_EQ(wire.requests_size(), 1);
  EXPECT_EQ(wire.requests(0).SerializeAsString(), in.request().SerializeAsString());
}

TEST(EngineWireTest, ACompletionCarriesTheHandleStatusAndOutputs) {
  OpResult mismatch;
  mismatch.status = absl::FailedPreconditionError("shape mismatch: rank 0 [2], rank 1 [3]");
  v1::LocalCompletion failed;
  ToProto(mismatch, 7, &failed);
  EXPECT_EQ(failed.handle(), 7u);
  EXPECT_EQ(failed.code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(failed.message(), "shape mismatch: rank 0 [2], rank 1 [3]");

  OpResult output;
  output.output_offset = 1024;
  output.output_shape = {6, 3};
  output.done_event = 2;
  v1::LocalCompletion gathered;
  ToProto(output, 8, &gathered);
  EXPECT_EQ(gathered.handle(), 8u);
  EXPECT_EQ(gathered.code(), 0);
  EXPECT_EQ(gathered.output_offset(), 1024);
  EXPECT_THAT(gathered.output_shape(), ElementsAre(6, 3));
  EXPECT_EQ(gathered.done_event(), 2);

  OpResult join;
  join.last_joined_rank = 3;
  v1::LocalCompletion joined;
  ToProto(join, 9, &joined);
  EXPECT_EQ(joined.last_joined_rank(), 3);
}

TEST(EngineWireTest, AResponseListBecomesTheCycleTheEngineApplies) {
  v1::ResponseList in;
  in.set_job_id("job-000009");
  in.set_cache_generation(5);
  in.set_fusion_threshold_bytes(1 << 20);
  in.set_cycle_time_ms(2.5);
  v1::CacheAssignment* a = in.add_cache_assignments();
  a->set_name("b");
  a->set_id(11);
  in.add_evicted_ids(3);
  in.add_resend_ids(4);
  v1::Response* error = in.add_rank_errors();
  error->set_type(v1::Response::TYPE_ERROR);
  error->add_names("dup");
  error->set_error_message("already in flight");
  // Steady state: cache ids only, no names.
  v1::Response* r = in.add_responses();
  r->set_type(v1::Response::TYPE_ALLREDUCE);
  r->add_cache_ids(11);
  r->add_cache_ids(12);
  r->set_dtype(v1::DATA_TYPE_FLOAT32);
  r->set_reduce_op(v1::REDUCE_OP_AVERAGE);
  r->add_tensor_sizes(4);
  r->add_tensor_sizes(8);
  v1::Response* g = in.add_responses();
  g->set_type(v1::Response::TYPE_ALLGATHER);
  g->add_names("g");
  g->add_tensor_sizes(1);
  g->add_tensor_sizes(2);
  g->add_row_elements(3);

  RankCycle cycle;
  FromProto(in, &cycle);
  EXPECT_EQ(cycle.cache_generation, 5u);
  EXPECT_EQ(cycle.fusion_threshold_bytes, 1 << 20);
  EXPECT_EQ(cycle.cycle_time_ms, 2.5);
  ASSERT_EQ(cycle.cache_assignments.size(), 1u);
  EXPECT_EQ(cycle.cache_assignments[0].name, "b");
  EXPECT_EQ(cycle.cache_assignments[0].id, 11u);
  EXPECT_THAT(cycle.evicted_ids, ElementsAre(3));
  EXPECT_THAT(cycle.resend_ids, ElementsAre(4));
  ASSERT_EQ(cycle.rank_errors.size(), 1u);
  EXPECT_EQ(cycle.rank_errors[0].type, Response::Type::kError);
  EXPECT_THAT(cycle.rank_errors[0].names, ElementsAre("dup"));
  EXPECT_EQ(cycle.rank_errors[0].error_message, "already in flight");
  ASSERT_EQ(cycle.responses.size(), 2u);
  EXPECT_EQ(cycle.responses[0].type, Response::Type::kAllreduce);
  EXPECT_THAT(cycle.responses[0].names, ElementsAre("", ""));  // one per cache id
  EXPECT_THAT(cycle.responses[0].cache_ids, ElementsAre(11, 12));
  EXPECT_EQ(cycle.responses[0].reduce_op, ReduceOp::kAverage);
  EXPECT_THAT(cycle.responses[0].tensor_sizes, ElementsAre(4, 8));
  EXPECT_EQ(cycle.responses[1].type, Response::Type::kAllgather);
  EXPECT_THAT(cycle.responses[1].names, ElementsAre("g"));
  EXPECT_THAT(cycle.responses[1].row_elements, ElementsAre(3));
}

TEST(EngineWireTest, ASpanKeepsItsActivitiesInOrder) {
  ExecutionSpan span;
  span.tensors = {"a", "b"};
  span.op = "ALLREDUCE";
  span.start_unix_us = 100;
  span.activities = {{"QUEUE", 110}, {"GLOO_ALLREDUCE", 150}};
  v1::ExecutionSpan wire;
  ToProto(span, &wire);
  EXPECT_THAT(wire.tensors(), ElementsAre("a", "b"));
  EXPECT_EQ(wire.op(), "ALLREDUCE");
  EXPECT_EQ(wire.start_unix_us(), 100);
  EXPECT_THAT(wire.activities(), ElementsAre("QUEUE", "GLOO_ALLREDUCE"));
  EXPECT_THAT(wire.activity_end_unix_us(), ElementsAre(110, 150));
}

}  // namespace
}  // namespace ringmaster
