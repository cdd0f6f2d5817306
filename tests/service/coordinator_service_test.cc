// The coordinator's gRPC services on an in-process server with real channels: simulated workers
// hold real Session streams and negotiate multi-step jobs end to end.
#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/sim_worker.h"
#include "coordinator/server.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "ringmaster/v1/job.grpc.pb.h"
#include "ringmaster/v1/rendezvous.grpc.pb.h"
#include "ringmaster/v1/worker.grpc.pb.h"

namespace ringmaster {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kWait = absl::Seconds(10);

std::unique_ptr<grpc::ClientContext> Ctx() {
  auto c = std::make_unique<grpc::ClientContext>();
  c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return c;
}

class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override { StartServer(CoordinatorOptions{}); }

  void StartServer(CoordinatorOptions options) {
    server_ = std::make_unique<CoordinatorServer>(std::move(options));
    absl::StatusOr<int> port = server_->Start("127.0.0.1:0");
    ASSERT_TRUE(port.ok()) << port.status();
    server_address_ = absl::StrCat("127.0.0.1:", *port);
    channel_ = grpc::CreateChannel(server_address_, grpc::InsecureChannelCredentials());
    jobs_ = v1::JobService::NewStub(channel_);
    workers_ = v1::WorkerService::NewStub(channel_);
    rendezvous_ = v1::RendezvousService::NewStub(channel_);
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

  v1::Job Submit(int np, int per_host = 0, int cycle_time_ms = 1) {
    v1::RegisterJobRequest request;
    request.mutable_spec()->set_name("svc-test");
    request.mutable_spec()->set_np(np);
    request.mutable_spec()->set_processes_per_host(per_host);
    request.mutable_spec()->add_command("train");
    request.mutable_spec()->mutable_knobs()->set_cycle_time_ms(cycle_time_ms);
    v1::RegisterJobResponse response;
    grpc::Status s = jobs_->RegisterJob(Ctx().get(), request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response.job();
  }

  v1::Job Get(const std::string& id) {
    v1::GetJobRequest request;
    request.set_job_id(id);
    v1::GetJobResponse response;
    EXPECT_TRUE(jobs_->GetJob(Ctx().get(), request, &response).ok());
    return response.job();
  }

  // Polls until the job is in `state` or the deadline passes.
  v1::Job AwaitState(const std::string& id, v1::JobState state, absl::Duration timeout = kWait) {
    const absl::Time deadline = absl::Now() + timeout;
    v1::Job job = Get(id);
    while (job.state() != state && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));
      job = Get(id);
    }
    return job;
  }

  static v1::TensorRequest Allreduce(const std::string& name, std::vector<int64_t> shape,
                                     v1::DataType dtype = v1::DATA_TYPE_FLOAT32) {
    v1::TensorRequest r;
    r.set_name(name);
    r.set_type(v1::REQUEST_TYPE_ALLREDUCE);
    r.set_dtype(dtype);
    for (int64_t d : shape) r.add_shape(d);
    return r;
  }

  std::unique_ptr<CoordinatorServer> server_;
  std::string server_address_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::WorkerService::Stub> workers_;
  std::unique_ptr<v1::RendezvousService::Stub> rendezvous_;
  std::vector<std::unique_ptr<SimWorker>> sims_;
};

TEST_F(ServiceTest, FourWorkersNegotiateAMultiStepJobEndToEnd) {
  std::vector<SimWorker*> w;
  for (const char* host : {"host-b", "host-a", "host-b", "host-a"}) w.push_back(&AddWorker(host));
  v1::Job job = Submit(4, 2);
  std::vector<v1::JobAssignment> a(4);
  for (int i = 0; i < 4; ++i) {
    auto got = w[i]->WaitAssignment(kWait);
    ASSERT_TRUE(got.ok()) << got.status();
    a[i] = *got;
  }
  // Ranks ordered by (host, device): host-a's workers are ranks 0-1, host-b's 2-3.
  for (int i = 0; i < 4; ++i) {
    const v1::RankInfo& r = a[i].job().ranks(a[i].rank());
    EXPECT_EQ(r.worker_id(), w[i]->worker_id());
    EXPECT_EQ(r.host(), i % 2 == 1 ? "host-a" : "host-b");
    EXPECT_EQ(r.rank() / 2, i % 2 == 1 ? 0 : 1);
    EXPECT_EQ(r.local_size(), 2);
    EXPECT_EQ(r.cross_size(), 2);
    EXPECT_EQ(r.cross_rank(), r.rank() / 2);
    EXPECT_EQ(r.local_rank(), r.rank() % 2);
  }
  EXPECT_EQ(AwaitState(job.id(), v1::JOB_STATE_STARTING).state(), v1::JOB_STATE_STARTING);
  for (int i = 0; i < 4; ++i)
    ASSERT_TRUE(w[i]->SendRankUpdate(a[i], v1::RANK_STATE_STARTED, 0).ok());
  EXPECT_EQ(AwaitState(job.id(), v1::JOB_STATE_RUNNING).state(), v1::JOB_STATE_RUNNING);

  const std::vector<v1::TensorRequest> step = {Allreduce("fc.bias", {10}),
                                               Allreduce("fc.weight", {10, 20}),
                                               Allreduce("conv.weight", {4, 3, 3, 3})};
  for (int s = 0; s < 5; ++s) {
    std::vector<std::vector<v1::Response>> got(4);
    std::vector<std::thread> threads;
    for (int i = 0; i < 4; ++i) {
      threads.emplace_back([&, i] {
        // Each rank submits in its own order.
        std::vector<v1::TensorRequest> mine = step;
        std::rotate(mine.begin(), mine.begin() + i % 3, mine.end());
        auto out = w[i]->Negotiate(a[i], mine, kWait);
        ASSERT_TRUE(out.ok()) << out.status();
        got[i] = *out;
      });
    }
    for (auto& t : threads) t.join();
    // Every rank executes the same fused response, in the same order.
    ASSERT_EQ(got[0].size(), 1u) << "step " << s;
    EXPECT_EQ(got[0][0].type(), v1::Response::TYPE_ALLREDUCE);
    EXPECT_EQ(got[0][0].names_size(), 3);
    for (int i = 1; i < 4; ++i) {
      ASSERT_EQ(got[i].size(), 1u);
      EXPECT_THAT(got[i][0].names(), ::testing::ElementsAreArray(got[0][0].names()));
      EXPECT_THAT(got[i][0].tensor_sizes(), ::testing::ElementsAreArray(got[0][0].tensor_sizes()));
    }
  }
  for (int i = 0; i < 4; ++i)
    ASSERT_TRUE(w[i]->SendRankUpdate(a[i], v1::RANK_STATE_EXITED, 0).ok());
  v1::Job done = AwaitState(job.id(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done.reason(), "all 4 ranks exited 0");
}

TEST_F(ServiceTest, AHostsRelaySendsItsRanksBatchesInOneMessageAndGetsOneListForThem) {
  // Ranks 0-1 on host-a, 2-3 on host-b; each host's first worker relays for both of its ranks.
  std::vector<SimWorker*> w;
  for (const char* host : {"host-a", "host-a", "host-b", "host-b"}) w.push_back(&AddWorker(host));
  v1::Job job = Submit(4, 2);
  std::vector<v1::JobAssignment> a(4);
  for (int i = 0; i < 4; ++i) {
    auto got = w[i]->WaitAssignment(kWait);
    ASSERT_TRUE(got.ok()) << got.status();
    a[i] = *got;
    ASSERT_EQ(a[i].rank(), i);
    ASSERT_TRUE(w[i]->SendRankUpdate(a[i], v1::RANK_STATE_STARTED, 0).ok());
  }
  auto relayed = [&](std::vector<int> ranks, uint64_t seq,
                     const std::vector<v1::TensorRequest>& requests) {
    v1::WorkerMessage m;
    for (int rank : ranks) {
      v1::RequestBatch* b = m.mutable_relayed()->add_batches();
      b->set_job_id(job.id());
      b->set_epoch(a[rank].epoch());
      b->set_rank(rank);
      b->set_seq(seq);
      for (const v1::TensorRequest& r : requests) *b->add_requests() = r;
    }
    return m;
  };
  // Rank 1 (host-a) sends a bad request: its error is its own, and comes to its relay as rank 1's
  // notice, not in the list every rank gets.
  v1::TensorRequest bad = Allreduce("", {2});
  ASSERT_TRUE(w[0]->Send(relayed({0, 1}, 1, {Allreduce("g", {3})})).ok());
  v1::WorkerMessage host_a = relayed({0, 1}, 2, {});
  *host_a.mutable_relayed()->mutable_batches(1)->add_requests() = bad;
  ASSERT_TRUE(w[0]->Send(host_a).ok());
  std::vector<v1::RelayedResponses> got_a;
  absl::StatusOr<v1::RelayedResponses> r = w[0]->WaitRelayed(kWait);
  ASSERT_TRUE(r.ok()) << r.status();
  got_a.push_back(*r);
  ASSERT_TRUE(w[2]->Send(relayed({2, 3}, 1, {Allreduce("g", {3})})).ok());
  r = w[0]->WaitRelayed(kWait);
  ASSERT_TRUE(r.ok()) << r.status();
  got_a.push_back(*r);
  absl::StatusOr<v1::RelayedResponses> b = w[2]->WaitRelayed(kWait);
  ASSERT_TRUE(b.ok()) << b.status();
  // The bad request's cycle (notices only) came at once, to host-a's relay alone.
  EXPECT_THAT(got_a[0].ranks(), ::testing::ElementsAre(0, 1));
  EXPECT_EQ(got_a[0].list().responses_size(), 0);
  ASSERT_EQ(got_a[0].notices_size(), 1);
  EXPECT_EQ(got_a[0].notices(0).rank(), 1);
  ASSERT_EQ(got_a[0].notices(0).part().rank_errors_size(), 1);
  EXPECT_EQ(got_a[0].notices(0).part().rank_errors(0).error_message(),
            "Invalid allreduce request for tensor '' from rank 1 (host-a): name is empty.");
  // Then g, the same list for both hosts' ranks, with no notices.
  EXPECT_THAT(got_a[1].ranks(), ::testing::ElementsAre(0, 1));
  EXPECT_THAT(b->ranks(), ::testing::ElementsAre(2, 3));
  EXPECT_EQ(got_a[1].notices_size(), 0);
  EXPECT_EQ(got_a[1].list().SerializeAsString(), b->list().SerializeAsString());
  ASSERT_EQ(b->list().responses_size(), 1);
  EXPECT_EQ(b->list().responses(0).type(), v1::Response::TYPE_ALLREDUCE);
  EXPECT_THAT(b->list().responses(0).tensor_sizes(), ::testing::ElementsAre(3));
  EXPECT_EQ(b->list().job_id(), job.id());
  EXPECT_EQ(b->list().seq(), got_a[0].list().seq() + 1);
  // Nothing came on the own sessions of ranks 0 and 1. Ranks 2 and 3 had sent nothing through
  // their relay yet when the notices' cycle went out, so it came to each on its own session.
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<v1::ResponseList> own = w[i]->WaitResponses(absl::Milliseconds(50));
    if (i < 2) {
      EXPECT_EQ(own.status().code(), absl::StatusCode::kDeadlineExceeded) << i;
      continue;
    }
    ASSERT_TRUE(own.ok()) << i << ": " << own.status();
    EXPECT_EQ(own->seq(), got_a[0].list().seq());
    EXPECT_EQ(own->responses_size(), 0);
    EXPECT_EQ(own->rank_errors_size(), 0);
  }

  // A host's batches may come in separate messages of its relay.
  ASSERT_TRUE(w[0]->Send(relayed({0, 1}, 3, {Allreduce("h", {1})})).ok());
  ASSERT_TRUE(w[2]->Send(relayed({3}, 2, {Allreduce("h", {1})})).ok());
  EXPECT_EQ(w[2]->WaitRelayed(absl::Milliseconds(200)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(w[2]->Send(relayed({2}, 2, {Allreduce("h", {1})})).ok());
  absl::StatusOr<v1::RelayedResponses> h = w[2]->WaitRelayed(kWait);
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->list().responses_size(), 1);
  EXPECT_THAT(h->list().responses(0).tensor_sizes(), ::testing::ElementsAre(1));
  ASSERT_TRUE(w[0]->WaitRelayed(kWait).ok());

  // By cache id: each relay sends g's id once for both of its ranks (shared_cached_ids), and
  // one list answers the four ranks.
  uint32_t g = 0;
  for (const v1::CacheAssignment& c : b->list().cache_assignments()) {
    if (c.name() == "g") g = c.id();
  }
  ASSERT_NE(g, 0u);
  v1::WorkerMessage shared_a = relayed({0, 1}, 4, {});
  shared_a.mutable_relayed()->add_shared_cached_ids(g);
  v1::WorkerMessage shared_b = relayed({2, 3}, 3, {});
  shared_b.mutable_relayed()->add_shared_cached_ids(g);
  ASSERT_TRUE(w[0]->Send(shared_a).ok());
  ASSERT_TRUE(w[2]->Send(shared_b).ok());
  for (int relay : {0, 2}) {
    absl::StatusOr<v1::RelayedResponses> by_id = w[relay]->WaitRelayed(kWait);
    ASSERT_TRUE(by_id.ok()) << by_id.status();
    EXPECT_EQ(by_id->notices_size(), 0);
    ASSERT_EQ(by_id->list().responses_size(), 1);
    EXPECT_THAT(by_id->list().responses(0).cache_ids(), ::testing::ElementsAre(g));
    EXPECT_THAT(by_id->list().responses(0).tensor_sizes(), ::testing::ElementsAre(3));
  }

  // A relay may not carry another host's rank: rather than leave rank 2 waiting for lists that
  // never come, the coordinator ends the relay's session (ABORTED, naming the ranks), so that its
  // daemon stops relaying and the ranks it carried resume on their own sessions.
  ASSERT_TRUE(w[0]->Send(relayed({2}, 4, {Allreduce("h2", {1})})).ok());
  grpc::Status refused = w[0]->Close();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(
      refused.error_message(),
      ::testing::MatchesRegex(absl::StrCat(
          "relayed batches refused: relay worker-[0-9]+ \\(rank 0, host host-a\\) may not "
          "relay rank 2 of job ",
          job.id(), ", whose worker is on host host-b and relayed by rank 2; relaying ends")));
}

TEST_F(ServiceTest, ARelayedMessageOverItsBoundsEndsTheSessionNamingTheField) {
  // Shared ids count once per batch: no more in all than a message's worth of ids in the batches.
  SimWorker& relay = AddWorker("host-a");
  v1::WorkerMessage m;
  for (int i = 0; i < 2; ++i) m.mutable_relayed()->add_batches()->set_rank(i);
  for (uint32_t id = 1; id <= (1u << 19) + 1; ++id) m.mutable_relayed()->add_shared_cached_ids(id);
  ASSERT_TRUE(relay.Send(m).ok());
  grpc::Status s = relay.Close();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(),
            "relayed.shared_cached_ids has 524289 ids for 2 batches; at most 1048576 in all");

  SimWorker& other = AddWorker("host-b");
  v1::WorkerMessage many;
  for (int i = 0; i < 513; ++i) many.mutable_relayed()->add_batches()->set_rank(i);
  ASSERT_TRUE(other.Send(many).ok());
  s = other.Close();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "relayed.batches has 513 batches; at most 512");

  // Cache ids reported used in local negotiation: at most 1024 a batch, relayed or not.
  SimWorker& third = AddWorker("host-c");
  v1::WorkerMessage used;
  v1::RequestBatch* b = used.mutable_relayed()->add_batches();
  for (uint32_t id = 1; id <= 1025; ++id) b->add_used_ids(id);
  ASSERT_TRUE(third.Send(used).ok());
  s = third.Close();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "relayed.batches[0].used_ids has 1025 ids; at most 1024");

  SimWorker& fourth = AddWorker("host-d");
  v1::WorkerMessage direct;
  for (uint32_t id = 1; id <= 1025; ++id) direct.mutable_requests()->add_used_ids(id);
  ASSERT_TRUE(fourth.Send(direct).ok());
  s = fourth.Close();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "requests.used_ids has 1025 ids; at most 1024");
}

TEST_F(ServiceTest, MismatchedShapesReachEveryRankWithTheCoordinatorsMessage) {
  SimWorker& w0 = AddWorker("h0");
  SimWorker& w1 = AddWorker("h1");
  v1::Job job = Submit(2, 1);
  auto a0 = w0.WaitAssignment(kWait);
  auto a1 = w1.WaitAssignment(kWait);
  ASSERT_TRUE(a0.ok() && a1.ok());
  // Whichever worker got rank 0 sends [2, 3]; the other [2, 4].
  SimWorker& r0 = a0->rank() == 0 ? w0 : w1;
  SimWorker& r1 = a0->rank() == 0 ? w1 : w0;
  const v1::JobAssignment& as0 = a0->rank() == 0 ? *a0 : *a1;
  const v1::JobAssignment& as1 = a0->rank() == 0 ? *a1 : *a0;
  std::vector<v1::Response> got0, got1;
  std::thread t([&] {
    auto out = r1.Negotiate(as1, {Allreduce("grad", {2, 4}), Allreduce("ok", {5})}, kWait);
    ASSERT_TRUE(out.ok()) << out.status();
    got1 = *out;
  });
  auto out = r0.Negotiate(as0, {Allreduce("grad", {2, 3}), Allreduce("ok", {5})}, kWait);
  t.join();
  ASSERT_TRUE(out.ok()) << out.status();
  got0 = *out;
  const std::string expected =
      "Mismatched allreduce tensor shapes for tensor 'grad': rank 0 (h0) sent [2, 3] but rank 1 "
      "(h1) sent [2, 4].";
  for (const auto* got : {&got0, &got1}) {
    int errors = 0, ok = 0;
    for (const v1::Response& r : *got) {
      if (r.type() == v1::Response::TYPE_ERROR) {
        ++errors;
        EXPECT_THAT(r.names(), ::testing::ElementsAre("grad"));
        // Rank order follows the submission order; accept either rank first.
        EXPECT_TRUE(r.error_message() == expected ||
                    r.error_message() ==
                        "Mismatched allreduce tensor shapes for tensor 'grad': rank 1 (h1) sent "
                        "[2, 4] but rank 0 (h0) sent [2, 3].")
            << r.error_message();
      } else {
        ++ok;
        EXPECT_THAT(r.names(), ::testing::ElementsAre("ok"));
      }
    }
    EXPECT_EQ(errors, 1);
    EXPECT_EQ(ok, 1);
  }
  EXPECT_EQ(Get(job.id()).state(), v1::JOB_STATE_STARTING);
}

TEST_F(ServiceTest, BadWorkerInputIsRejectedWithTheFieldNamed) {
  v1::RegisterWorkerRequest request;
  request.set_host("h");
  request.set_device("gpu0");
  v1::RegisterWorkerResponse response;
  grpc::Status s = workers_->RegisterWorker(Ctx().get(), request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "device 'gpu0' is not \"cpu\" or \"cuda:N\" (0 <= N < 1024)");
  request.set_host("");
  request.set_device("cpu");
  s = workers_->RegisterWorker(Ctx().get(), request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "host must be 1..253 bytes; got 0");

  // A reconnect that claims more ranks than a worker can serve is refused, naming the field.
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto stream = workers_->Session(&context);
    v1::WorkerMessage open;
    open.mutable_open()->set_worker_id("worker-424242");
    for (int i = 0; i < 5; ++i) open.mutable_open()->add_resume()->set_rank(i);
    ASSERT_TRUE(stream->Write(open));
    v1::CoordinatorMessage m;
    EXPECT_FALSE(stream->Read(&m));
    s = stream->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(s.error_message(), "open.resume has 5 entries; at most 4");
  }

  // A session for an unknown worker ends with NOT_FOUND.
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto stream = workers_->Session(&context);
  v1::WorkerMessage open;
  open.mutable_open()->set_worker_id("worker-424242");
  ASSERT_TRUE(stream->Write(open));
  v1::CoordinatorMessage m;
  EXPECT_FALSE(stream->Read(&m));
  s = stream->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(s.error_message(), "worker_id 'worker-424242' is not registered");
}

TEST_F(ServiceTest, AWorkerThatStopsReadingItsSessionIsCutOffNotQueuedForWithoutEnd) {
  // A worker whose transport takes only a little and which never reads: no BDP probing (which
  // would grow its window without end), a small stream window.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 16 << 10);
  auto channel =
      grpc::CreateCustomChannel(server_address_, grpc::InsecureChannelCredentials(), args);
  auto stub = v1::WorkerService::NewStub(channel);
  v1::RegisterWorkerRequest registration;
  registration.set_host("h0");
  registration.set_device("cpu");
  registration.set_incarnation(7);
  v1::RegisterWorkerResponse registered;
  ASSERT_TRUE(stub->RegisterWorker(Ctx().get(), registration, &registered).ok());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto stream = stub->Session(&context);
  v1::WorkerMessage open;
  open.mutable_open()->set_worker_id(registered.worker_id());
  open.mutable_open()->set_incarnation(7);
  open.mutable_open()->set_secret(registered.session_secret());
  ASSERT_TRUE(stream->Write(open));
  // A one-rank job: every tensor it submits is ready at once, and each cycle's list is queued for
  // it.
  const v1::Job job = AwaitState(Submit(1).id(), v1::JOB_STATE_STARTING);
  ASSERT_EQ(job.state(), v1::JOB_STATE_STARTING);
  v1::WorkerMessage started;
  started.mutable_rank_update()->set_job_id(job.id());
  started.mutable_rank_update()->set_epoch(job.epoch());
  started.mutable_rank_update()->set_state(v1::RANK_STATE_STARTED);
  ASSERT_TRUE(stream->Write(started));
  // Tensors, one batch at a time, until the coordinator ends the session (bounded: 30 s).
  int sent = 0;
  const absl::Time end = absl::Now() + absl::Seconds(30);
  while (absl::Now() < end) {
    v1::WorkerMessage m;
    v1::RequestBatch* b = m.mutable_requests();
    b->set_job_id(job.id());
    b->set_epoch(job.epoch());
    *b->add_requests() = Allreduce(absl::StrCat("t", sent), {1});
    if (!stream->Write(m)) break;
    ++sent;
    absl::SleepFor(absl::Microseconds(500));
  }
  EXPECT_LT(absl::Now(), end) << "the session was never cut; " << sent << " tensors sent";
  // What the transport took before it stopped, then the end (Finish waits for every message).
  v1::CoordinatorMessage m;
  int buffered = 0;
  while (stream->Read(&m)) ++buffered;
  const grpc::Status ended = stream->Finish();
  // Cancelled in the middle of a write that could not complete (what the coordinator logs is
  // RESOURCE_EXHAUSTED: "2048 messages wait to be written to worker ...").
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::CANCELLED) << ended.error_message();
  // More than the bound were answered: the cut came from the queue, not from anything sooner; the
  // worker's transport had taken only a small part of them (the rest waited in the queue).
  EXPECT_GT(sent, 2048);
  EXPECT_LT(buffered, sent / 4) << sent << " sent";
}

TEST_F(ServiceTest, RequestsForAJobTheWorkerDoesNotServeAreRefused) {
  SimWorker& w0 = AddWorker("h0");
  SimWorker& idle = AddWorker("h1");
  v1::Job job = Submit(1);
  auto a = w0.WaitAssignment(kWait);
  ASSERT_TRUE(a.ok());
  v1::JobAssignment stolen = *a;  // the idle worker pretends to be rank 0
  v1::WorkerMessage m;
  m.mutable_requests()->set_job_id(job.id());
  m.mutable_requests()->set_epoch(stolen.epoch());
  m.mutable_requests()->set_rank(0);
  *m.mutable_requests()->add_requests() = Allreduce("x", {1});
  ASSERT_TRUE(idle.Send(m).ok());
  auto stop = idle.WaitStop(kWait);
  ASSERT_TRUE(stop.ok()) << stop.status();
  EXPECT_EQ(stop->job_id(), job.id());
  EXPECT_EQ(stop->reason(), absl::StrCat("FAILED_PRECONDITION: worker ", idle.worker_id(),
                                         " is not assigned rank 0 of job ", job.id()));
  // A stale epoch is ABORTED.
  m.mutable_requests()->set_epoch(stolen.epoch() + 7);
  ASSERT_TRUE(w0.Send(m).ok());
  stop = w0.WaitStop(kWait);
  ASSERT_TRUE(stop.ok()) << stop.status();
  EXPECT_EQ(stop->reason(),
            absl::StrCat("ABORTED: epoch ", stolen.epoch() + 7, " of job ", job.id(),
                         " is stale; the job is at epoch ", stolen.epoch()));
  EXPECT_EQ(Get(job.id()).state(), v1::JOB_STATE_STARTING);
}

TEST_F(ServiceTest, RankExitFailsTheJobAndStopsTheOtherRanks) {
  SimWorker& w0 = AddWorker("h0");
  SimWorker& w1 = AddWorker("h1");
  v1::Job job = Submit(2);
  auto a0 = w0.WaitAssignment(kWait);
  auto a1 = w1.WaitAssignment(kWait);
  ASSERT_TRUE(a0.ok() && a1.ok());
  ASSERT_TRUE(w1.SendRankUpdate(*a1, v1::RANK_STATE_EXITED, 3, "Traceback: boom").ok());
  v1::Job failed = AwaitState(job.id(), v1::JOB_STATE_FAILED);
  ASSERT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(failed.reason(), absl::StrCat("rank ", a1->rank(), " on host h1 (", w1.worker_id(),
                                          ") exited with status 3: Traceback: boom"));
  auto stop = w0.WaitStop(kWait);
  ASSERT_TRUE(stop.ok()) << stop.status();
  EXPECT_EQ(stop->reason(), failed.reason());
  // The workers are free again: the next job is scheduled on them.
  v1::Job next = Submit(2);
  EXPECT_TRUE(w0.WaitAssignment(kWait).ok());
  EXPECT_TRUE(w1.WaitAssignment(kWait).ok());
  EXPECT_EQ(AwaitState(next.id(), v1::JOB_STATE_STARTING).state(), v1::JOB_STATE_STARTING);
}

TEST_F(ServiceTest, RendezvousRelaysTheNcclIdAndTimesOutWithTheMissingKeys) {
  SimWorker& w0 = AddWorker("h0");
  SimWorker& w1 = AddWorker("h1");
  v1::Job job = Submit(2);
  auto a0 = w0.WaitAssignment(kWait);
  ASSERT_TRUE(a0.ok() && w1.WaitAssignment(kWait).ok());
  const int64_t epoch = a0->epoch();
  // Every rendezvous call carries the epoch's token, which only the job's workers were sent.
  const std::string token = a0->rendezvous_token();
  ASSERT_EQ(token.size(), 64u);
  auto ctx = [&token] {
    std::unique_ptr<grpc::ClientContext> c = Ctx();
    c->AddMetadata("x-ringmaster-rendezvous-token", token);
    return c;
  };
  // Rank 1 waits for the id that rank 0's worker generates.
  v1::WaitResponse waited;
  grpc::Status wait_status;
  std::thread waiter([&, ctx] {
    v1::WaitRequest w;
    w.set_job_id(job.id());
    w.set_epoch(epoch);
    w.add_keys("nccl/unique_id");
    w.set_timeout_ms(5000);
    wait_status = rendezvous_->Wait(ctx().get(), w, &waited);
  });
  v1::SetRequest set;
  set.set_job_id(job.id());
  set.set_epoch(epoch);
  set.set_key("nccl/unique_id");
  set.set_value(std::string(128, '\x7f'));
  v1::SetResponse set_response;
  ASSERT_TRUE(rendezvous_->Set(ctx().get(), set, &set_response).ok());
  waiter.join();
  ASSERT_TRUE(wait_status.ok()) << wait_status.error_message();
  EXPECT_THAT(waited.values(), ::testing::ElementsAre(std::string(128, '\x7f')));

  v1::WaitRequest w;
  w.set_job_id(job.id());
  w.set_epoch(epoch);
  w.add_keys("nccl/unique_id");
  w.add_keys("gloo/rank_1");
  w.set_timeout_ms(200);
  grpc::Status s = rendezvous_->Wait(ctx().get(), w, &waited);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(s.error_message(), "rendezvous wait timed out; keys not set: gloo/rank_1");

  set.set_epoch(epoch + 1);
  s = rendezvous_->Set(ctx().get(), set, &set_response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_EQ(s.error_message(), absl::StrCat("epoch ", epoch + 1, " of job ", job.id(),
                                            " is stale; the job is at epoch ", epoch));
}

TEST_F(ServiceTest, ListJobsPagesNewestFirstWithinItsBounds) {
  for (int i = 0; i < 250; ++i) Submit(1);
  std::vector<std::string> ids;
  v1::ListJobsRequest request;
  std::vector<int> sizes;
  for (int pages = 0; pages < 10; ++pages) {
    v1::ListJobsResponse page;
    grpc::Status s = jobs_->ListJobs(Ctx().get(), request, &page);
    ASSERT_TRUE(s.ok()) << s.error_message();
    sizes.push_back(page.jobs_size());
    for (const v1::Job& j : page.jobs()) ids.push_back(j.id());
    if (page.next_page_token().empty()) break;
    EXPECT_EQ(page.next_page_token(), ids.back());
    request.set_page_token(page.next_page_token());
  }
  EXPECT_EQ(sizes, (std::vector<int>{100, 100, 50}));
  ASSERT_EQ(ids.size(), 250u);
  EXPECT_EQ(ids.front(), "job-000250");
  EXPECT_EQ(ids.back(), "job-000001");
  EXPECT_TRUE(std::is_sorted(ids.rbegin(), ids.rend()));

  request.Clear();
  request.set_page_size(7);
  v1::ListJobsResponse page;
  ASSERT_TRUE(jobs_->ListJobs(Ctx().get(), request, &page).ok());
  EXPECT_EQ(page.jobs_size(), 7);
  EXPECT_EQ(page.next_page_token(), "job-000244");
  request.set_page_size(1001);
  grpc::Status s = jobs_->ListJobs(Ctx().get(), request, &page);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "page_size 1001 is out of bounds [0, 1000]");
  request.set_page_size(0);
  request.set_page_token("bogus");
  s = jobs_->ListJobs(Ctx().get(), request, &page);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "page_token 'bogus' is not a ListJobsResponse.next_page_token");
  // A token is a place, not a job that must still be listed: a filter that the token's job no
  // longer matches still pages on from there.
  request.set_page_token("job-000244");
  request.add_states(v1::JOB_STATE_PENDING);
  ASSERT_TRUE(jobs_->ListJobs(Ctx().get(), request, &page).ok());
  ASSERT_EQ(page.jobs_size(), 100);
  EXPECT_EQ(page.jobs(0).id(), "job-000243");
}

class LeaseTest : public ServiceTest {
 protected:
  void SetUp() override {
    CoordinatorOptions options;
    options.lease = absl::Milliseconds(600);
    options.heartbeat_interval = absl::Milliseconds(200);
    options.housekeeping_interval = absl::Milliseconds(20);
    StartServer(std::move(options));
  }
};

TEST_F(LeaseTest, AWorkerThatStopsHeartbeatingFailsItsJobOnly) {
  SimWorker& w0 = AddWorker("h0");
  SimWorker& silent = AddWorker("h1");
  SimWorker& other = AddWorker("h2");
  v1::Job job = Submit(2, 1);
  // The third worker keeps heartbeating and serves a job of its own afterwards.
  auto a0 = w0.WaitAssignment(kWait);
  auto a1 = silent.WaitAssignment(kWait);
  ASSERT_TRUE(a0.ok() && a1.ok());
  v1::Job solo = Submit(1);
  auto a2 = other.WaitAssignment(kWait);
  ASSERT_TRUE(a2.ok());
  std::atomic<bool> stop{false};
  std::thread beats([&] {
    v1::WorkerMessage hb;
    hb.mutable_heartbeat();
    while (!stop) {
      w0.Send(hb).IgnoreError();
      other.Send(hb).IgnoreError();
      absl::SleepFor(absl::Milliseconds(100));
    }
  });
  v1::Job failed = AwaitState(job.id(), v1::JOB_STATE_FAILED, absl::Seconds(5));
  stop = true;
  beats.join();
  ASSERT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(failed.reason(),
            absl::StrCat("worker ", silent.worker_id(), " serving rank ", a1->rank(),
                         " on host h1 was lost: no heartbeat for 600ms"));
  EXPECT_EQ(Get(solo.id()).state(), v1::JOB_STATE_STARTING);
  // The lost worker's session ended with FAILED_PRECONDITION.
  grpc::Status closed = silent.Close();
  EXPECT_EQ(closed.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(closed.error_message(), HasSubstr("lost its lease"));
}

}  // namespace
}  // namespace ringmaster
