// The C++ client against a fake daemon on the other end of a socketpair: the handshake, staging
// into the shared arena and back, zero copy for tensors already in it, errors on exactly the
// failing operation, a lost connection, and a full arena that waits for staged tensors to come
// back. The fake speaks the daemon's local protocol frame by frame, so each test says what the
// daemon sees.
#include "ringmaster/client.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/client_internal.h"
#include "common/framing.h"
#include "common/shared_memory.h"
#include "gtest/gtest.h"
#include "ringmaster/v1/local.pb.h"

namespace ringmaster {
namespace {

constexpr size_t kArenaBytes = 4096;

// The daemon's end: a host arena of kArenaBytes, of which `client_bytes` are the client's.
class FakeDaemon {
 public:
  explicit FakeDaemon(size_t client_bytes = 1024) : client_bytes_(client_bytes) {
    int fds[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    fd_ = fds[0];
    client_fd_ = fds[1];
    arena_ = *SharedMemory::Create("client-test", kArenaBytes);
  }
  ~FakeDaemon() { Close(); }

  // Connects the client: answers its hello with a welcome and the arena's descriptor.
  std::unique_ptr<Client> Connect() {
    std::optional<absl::StatusOr<std::unique_ptr<Client>>> client;
    std::thread t([&] {
      bool retry = false;
      client = Handshake(client_fd_, &retry);
    });
    v1::LocalRequest hello = Next();
    EXPECT_EQ(hello.kind_case(), v1::LocalRequest::kHello);
    EXPECT_EQ(hello.hello().pid(), getpid());
    v1::LocalReply reply;
    v1::LocalWelcome* w = reply.mutable_welcome();
    w->set_job_id("job-000007");
    w->set_rank(1);
    w->set_size(4);
    w->set_local_rank(1);
    w->set_local_size(2);
    w->set_cross_rank(0);
    w->set_cross_size(2);
    w->set_host("host-a");
    w->set_arena_name("client-test");
    w->set_arena_bytes(kArenaBytes);
    w->set_client_bytes(static_cast<int64_t>(client_bytes_));
    EXPECT_TRUE(WriteFrame(fd_, reply).ok());
    EXPECT_TRUE(SendFd(fd_, arena_->fd()).ok());
    t.join();
    EXPECT_TRUE(client->ok()) << client->status();
    return client->ok() ? *std::move(*client) : nullptr;
  }

  // The next frame from the client, within `timeout` (nullopt: none came, or the socket closed).
  std::optional<v1::LocalRequest> Receive(absl::Duration timeout) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) != 1) {
      return std::nullopt;
    }
    v1::LocalRequest request;
    if (!ReadFrame(fd_, &request).ok()) return std::nullopt;
    return request;
  }
  v1::LocalRequest Next() {
    std::optional<v1::LocalRequest> r = Receive(absl::Seconds(10));
    EXPECT_TRUE(r.has_value()) << "the client sent nothing within 10 s";
    return r.value_or(v1::LocalRequest());
  }
  v1::LocalEnqueue NextEnqueue() {
    v1::LocalRequest r = Next();
    EXPECT_EQ(r.kind_case(), v1::LocalRequest::kEnqueue) << r.DebugString();
    return r.enqueue();
  }

  void Complete(uint64_t handle, absl::Status status = absl::OkStatus()) {
    v1::LocalReply reply;
    reply.mutable_completion()->set_handle(handle);
    reply.mutable_completion()->set_code(static_cast<int>(status.code()));
    reply.mutable_completion()->set_message(std::string(status.message()));
    ASSERT_TRUE(WriteFrame(fd_, reply).ok());
  }
  void Send(const v1::LocalReply& reply) { ASSERT_TRUE(WriteFrame(fd_, reply).ok()); }

  float* Floats(int64_t offset) { return reinterpret_cast<float*>(arena_->data() + offset); }
  int client_fd() const { return client_fd_; }

  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  const size_t client_bytes_;
  int fd_ = -1;
  int client_fd_ = -1;  // the client's, once connected
  std::unique_ptr<SharedMemory> arena_;
};

TEST(ClientTest, TheAttachClaimComesFromTheEnvironment) {
  unsetenv("RINGMASTER_ATTACH_JOB");
  unsetenv("RINGMASTER_ATTACH_RANK");
  unsetenv("JOB_COMPLETION_INDEX");
  absl::StatusOr<AttachClaim> claim = AttachClaimFromEnvironment();
  ASSERT_TRUE(claim.ok());
  EXPECT_EQ(claim->job_name, "");  // none: a process the daemon started
  setenv("RINGMASTER_ATTACH_JOB", "train", 1);
  claim = AttachClaimFromEnvironment();
  EXPECT_EQ(claim.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(claim.status().message(),
            "RINGMASTER_ATTACH_JOB='train' names an attached job but neither "
            "RINGMASTER_ATTACH_RANK nor JOB_COMPLETION_INDEX says which rank this process is");
  // A Kubernetes Indexed Job's index is the rank...
  setenv("JOB_COMPLETION_INDEX", "3", 1);
  claim = AttachClaimFromEnvironment();
  ASSERT_TRUE(claim.ok()) << claim.status();
  EXPECT_EQ(claim->job_name, "train");
  EXPECT_EQ(claim->rank, 3);
  // ...unless RINGMASTER_ATTACH_RANK says otherwise.
  setenv("RINGMASTER_ATTACH_RANK", "1", 1);
  claim = AttachClaimFromEnvironment();
  ASSERT_TRUE(claim.ok()) << claim.status();
  EXPECT_EQ(claim->rank, 1);
  setenv("RINGMASTER_ATTACH_RANK", "-1", 1);
  EXPECT_EQ(AttachClaimFromEnvironment().status().message(),
            "RINGMASTER_ATTACH_RANK='-1' is not a rank (a number from 0)");
  unsetenv("RINGMASTER_ATTACH_JOB");
  unsetenv("RINGMASTER_ATTACH_RANK");
  unsetenv("JOB_COMPLETION_INDEX");
}

TEST(ClientTest, TopologyIsTheWelcomes) {
  FakeDaemon daemon;
  std::unique_ptr<Client> client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  const Topology& t = client->topology();
  EXPECT_EQ(t.job_id, "job-000007");
  EXPECT_EQ(t.rank, 1);
  EXPECT_EQ(t.size, 4);
  EXPECT_EQ(t.local_rank, 1);
  EXPECT_EQ(t.local_size, 2);
  EXPECT_EQ(t.cross_size, 2);
  EXPECT_EQ(t.host, "host-a");
  EXPECT_EQ(t.device, -1);
  EXPECT_EQ(t.arena_bytes, 1024u);
}

TEST(ClientTest, StagedTensorIsCopiedInAndTheResultCopiedBack) {
  FakeDaemon daemon;
  std::unique_ptr<Client> client = daemon.Connect();
  std::vector<float> grad = {1, 2, 3, 4};
  absl::StatusOr<Handle> h =
      client->AllreduceAsync("layer1.grad", grad.data(), DataType::kFloat32, {2, 2}, ReduceOp::kSum,
                             /*prescale=*/0.5, /*postscale=*/2.0);
  ASSERT_TRUE(h.ok()) << h.status();
  v1::LocalEnqueue e = daemon.NextEnqueue();
  EXPECT_EQ(e.handle(), *h);
  EXPECT_EQ(e.request().name(), "layer1.grad");
  EXPECT_EQ(e.request().type(), v1::REQUEST_TYPE_ALLREDUCE);
  EXPECT_EQ(e.request().dtype(), v1::DataType(static_cast<int>(DataType::kFloat32)));
  EXPECT_EQ(std::vector<int64_t>(e.request().shape().begin(), e.request().shape().end()),
            (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(e.request().prescale_factor(), 0.5);
  EXPECT_EQ(e.request().postscale_factor(), 2.0);
  EXPECT_EQ(e.request().device(), -1);
  EXPECT_EQ(e.ready_event(), 0);
  float* staged = daemon.Floats(e.offset());
  EXPECT_EQ(std::vector<float>(staged, staged + 4), (std::vector<float>{1, 2, 3, 4}));
  for (int i = 0; i < 4; ++i) staged[i] *= 10;  // the "reduction"
  EXPECT_FALSE(client->Poll(*h));
  daemon.Complete(*h);
  ASSERT_TRUE(client->Wait(*h, absl::Seconds(10)).ok());
  EXPECT_EQ(grad, (std::vector<float>{10, 20, 30, 40}));
  // Done and collected: the handle is gone.
  EXPECT_EQ(client->Wait(*h, absl::Seconds(1)).code(), absl::StatusCode::kNotFound);
}

TEST(ClientTest, TensorInTheArenaIsReducedInPlace) {
  FakeDaemon daemon;
  std::unique_ptr<Client> client = daemon.Connect();
  auto* grad = static_cast<float*>(client->Allocate(4 * sizeof(float)));
  ASSERT_NE(grad, nullptr);
  for (int i = 0; i < 4; ++i) grad[i] = static_cast<float>(i);
  absl::StatusOr<Handle> h =
      client->AllreduceAsync("w", grad, DataType::kFloat32, {4}, ReduceOp::kSum, 1.0, 1.0);
  ASSERT_TRUE(h.ok());
  v1::LocalEnqueue e = daemon.NextEnqueue();
  float* seen = daemon.Floats(e.offset());  // the same memory, no copy
  EXPECT_EQ(std::vector<float>(seen, seen + 4), (std::vector<float>{0, 1, 2, 3}));
  seen[3] = 42;
  EXPECT_EQ(grad[3], 42);  // visible before completion: it is the caller's own tensor
  daemon.Complete(*h);
  ASSERT_TRUE(client->Wait(*h, absl::Seconds(10)).ok());
  EXPECT_EQ(grad[3], 42);
  client->Free(grad);
}

TEST(ClientTest, AnErrorReachesExactlyTheFailingOperation) {
  FakeDaemon daemon;
  std::unique_ptr<Client> client = daemon.Connect();
  std::vector<float> a = {1, 2}, b = {3, 4};
  absl::StatusOr<Handle> ha =
      client->AllreduceAsync("a", a.data(), DataType::kFloat32, {2}, ReduceOp::kSum, 1.0, 1.0);
  absl::StatusOr<Handle> hb =
      client->AllreduceAsync("b", b.data(), DataType::kFloat32, {2}, ReduceOp::kSum, 1.0, 1.0);
  ASSERT_TRUE(ha.ok() && hb.ok());
  v1::LocalEnqueue ea = daemon.NextEnqueue();
  v1::LocalEnqueue eb = daemon.NextEnqueue();
  daemon.Floats(ea.offset())[0] = 100;
  daemon.Floats(eb.offset())[0] = 300;
  daemon.Complete(*hb);
  daemon.Complete(*ha, absl::InvalidArgumentError(
                           "mismatched shapes for tensor 'a': rank 0 has [2], rank 1 has [3]"));
  absl::Status sa = client->Wait(*ha, absl::Seconds(10));
  EXPECT_EQ(sa.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sa.message(), "mismatched shapes for tensor 'a': rank 0 has [2], rank 1 has [3]");
  EXPECT_EQ(a, (std::vector<float>{1, 2}));  // a failed operation leaves the tensor alone
  EXPECT_TRUE(client->Wait(*hb, absl::Seconds(10)).ok());
  EXPECT_EQ(b, (std::vector<float>{300, 4}));
}

TEST(ClientTest, ALostConnectionFailsWhatIsInFlightAndRefusesMore) {
  FakeDaemon daemon;
  std::unique_ptr<Client> client = daemon.Connect();
  std::vector<float> a = {1, 2};
  absl::StatusOr<Handle> h =
      client->AllreduceAsync("a", a.data(), DataType::kFloat32, {2}, ReduceOp::kSum, 1.0, 1.0);
  ASSERT_TRUE(h.ok());
  daemon.NextEnqueue();
  daemon.Close();
  absl::Status s = client->Wait(*h, absl::Seconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(s.message(), "the worker daemon closed the connection")) << s;
  absl::StatusOr<Handle> after =
      client->AllreduceAsync("b", a.data(), DataType::kFloat32, {2}, ReduceOp::kSum, 1.0, 1.0);
  EXPECT_EQ(after.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(after.status().message(), "the connection to the worker is closed");
}

TEST(ClientTest, ThenCallsBackOnceWithTheStatusAndTheResultInPlace) {
  FakeDaemon daemon;
  std::unique_ptr<Client> client = daemon.Connect();
  struct Seen {
    absl::Mutex mu;
    std::vector<std::pair<std::string, absl::Status>> calls ABSL_GUARDED_BY(mu);
  } seen;
  auto record = [&seen](std::string what) {
    return [&seen, what](absl::Status s) {
      absl::MutexLock lock(&seen.mu);
      seen.calls.emplace_back(what, std::move(s));
    };
  };
  auto calls = [&seen](size_t n) {
    absl::MutexLock lock(&seen.mu);
    auto enough = [&seen, n]()
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(seen.mu) { return seen.calls.size() >= n; };
    seen.mu.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
    return seen.calls;
  };
  std::vector<float> a = {1, 2}, b = {3, 4}, c = {5, 6};
  absl::StatusOr<Handle> ha =
      client->AllreduceAsync("a", a.data(), DataType::kFloat32, {2}, ReduceOp::kSum, 1.0, 1.0);
  absl::StatusOr<Handle> hb =
      client->AllreduceAsync("b", b.data(), DataType::kFloat32, {2}, ReduceOp::kSum, 1.0, 1.0);
  ASSERT_TRUE(ha.ok() && hb.ok());
  ASSERT_TRUE(client->Then(*ha, record("a")).ok());
  v1::LocalEnqueue ea = daemon.NextEnqueue();
  v1::LocalEnqueue eb = daemon.NextEnqueue();
  daemon.Floats(ea.offset())[0] = 100;
  daemon.Complete(*hb, absl::InvalidArgumentError("mismatched shapes"));
  daemon.Complete(*ha);
  auto done = calls(1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].first, "a");
  EXPECT_TRUE(done[0].second.ok()) << done[0].second;
  EXPECT_EQ(a, (std::vector<float>{100, 2}));  // copied back before the callback
  // Consumed: no Wait() on it; one completed already calls back at once, on this thread.
  EXPECT_EQ(client->Wait(*ha, absl::Seconds(1)).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(client->Then(*hb, record("b")).ok());
  done = calls(2);
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[1].first, "b");
  EXPECT_EQ(done[1].second, absl::InvalidArgumentError("mismatched shapes"));
  EXPECT_EQ(client->Then(*hb, record("b again")).code(), absl::StatusCode::kNotFound);
  // The connection closing calls back what is still in flight.
  absl::StatusOr<Handle> hc =
      client->AllreduceAsync("c", c.data(), DataType::kFloat32, {2}, ReduceOp::kSum, 1.0, 1.0);
  ASSERT_TRUE(hc.ok());
  ASSERT_TRUE(client->Then(*hc, record("c")).ok());
  daemon.NextEnqueue();
  daemon.Close();
  done = calls(3);
  ASSERT_EQ(done.size(), 3u);
  EXPECT_EQ(done[2].first, "c");
  EXPECT_EQ(done[2].second.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(c, (std::vector<float>{5, 6}));
}

TEST(ClientTest, AFullArenaWaitsForStagedTensorsToComeBack) {
  FakeDaemon daemon(/*client_bytes=*/256);
  std::unique_ptr<Client> client = daemon.Connect();
  std::vector<float> first(64, 1.0f), second(64, 2.0f);  // 256 bytes each: one at a time
  absl::StatusOr<Handle> h1 = client->AllreduceAsync("first", first.data(), DataType::kFloat32,
                                                     {64}, ReduceOp::kSum, 1.0, 1.0);
  ASSERT_TRUE(h1.ok());
  v1::LocalEnqueue e1 = daemon.NextEnqueue();
  std::optional<absl::StatusOr<Handle>> h2;
  std::thread submitter([&] {
    h2 = client->AllreduceAsync("second", second.data(), DataType::kFloat32, {64}, ReduceOp::kSum,
                                1.0, 1.0);
  });
  // The second waits for arena memory: nothing reaches the daemon until the first completes.
  EXPECT_FALSE(daemon.Receive(absl::Milliseconds(200)).has_value());
  daemon.Complete(*h1);
  v1::LocalEnqueue e2 = daemon.NextEnqueue();
  submitter.join();
  ASSERT_TRUE(h2.has_value() && h2->ok());
  EXPECT_EQ(e2.request().name(), "second");
  EXPECT_EQ(e2.offset(), e1.offset());  // the memory the first gave back
  EXPECT_EQ(daemon.Floats(e2.offset())[0], 2.0f);
  EXPECT_TRUE(client->Wait(*h1, absl::Seconds(10)).ok());
  daemon.Complete(**h2);
  EXPECT_TRUE(client->Wait(**h2, absl::Seconds(10)).ok());
}

TEST(ClientTest, ATensorLargerThanTheArenaIsRefusedAndNothingIsSent) {
  FakeDaemon daemon(/*client_bytes=*/256);
  std::unique_ptr<Client> client = daemon.Connect();
  std::vector<float> big(65);  // 260 bytes
  absl::StatusOr<Handle> h =
      client->AllreduceAsync("big", big.data(), DataType::kFloat32, {65}, ReduceOp::kSum, 1, 1);
  EXPECT_EQ(h.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(h.status().message(),
            "shared arena full: 260 bytes requested, more than the whole arena; the arena holds "
            "256 bytes for this process: start the workers with a larger --arena-mb (ringmaster "
            "local --arena-mb)");
  // A group's members complete together, so all of them must fit at once.
  std::vector<float> x(48), y(48);  // 192 bytes each
  absl::StatusOr<std::vector<Handle>> g = client->GroupedAllreduceAsync(
      {"x", "y"}, {x.data(), y.data()}, DataType::kFloat32, {{48}, {48}}, ReduceOp::kSum, 1, 1);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(g.status().message(), "needs 384 bytes staged at once"))
      << g.status();
  EXPECT_FALSE(daemon.Receive(absl::Milliseconds(100)).has_value());
}

TEST(ClientTest, AllgatherOutputIsCopiedOutAndItsMemoryGivenBack) {
  FakeDaemon daemon;
  std::unique_ptr<Client> client = daemon.Connect();
  std::vector<float> mine = {5, 6};
  absl::StatusOr<Handle> h = client->AllgatherAsync("g", mine.data(), DataType::kFloat32, {1, 2});
  ASSERT_TRUE(h.ok());
  v1::LocalEnqueue e = daemon.NextEnqueue();
  EXPECT_EQ(e.request().type(), v1::REQUEST_TYPE_ALLGATHER);
  constexpr int64_t kOutput = 2048;  // the daemon's part of the arena
  float* out = daemon.Floats(kOutput);
  for (int i = 0; i < 6; ++i) out[i] = static_cast<float>(i);
  v1::LocalReply reply;
  v1::LocalCompletion* c = reply.mutable_completion();
  c->set_handle(*h);
  c->set_output_offset(kOutput);
  c->add_output_shape(3);
  c->add_output_shape(2);
  daemon.Send(reply);
  ASSERT_TRUE(client->Wait(*h, absl::Seconds(10)).ok());
  absl::StatusOr<AllgatherOutput> gathered = client->TakeAllgather(*h);
  ASSERT_TRUE(gathered.ok());
  EXPECT_EQ(gathered->shape, (std::vector<int64_t>{3, 2}));
  ASSERT_EQ(gathered->data.size(), 6 * sizeof(float));
  const auto* values = reinterpret_cast<const float*>(gathered->data.data());
  EXPECT_EQ(std::vector<float>(values, values + 6), (std::vector<float>{0, 1, 2, 3, 4, 5}));
  v1::LocalRequest release = daemon.Next();
  ASSERT_EQ(release.kind_case(), v1::LocalRequest::kRelease);
  EXPECT_EQ(release.release().offset(), kOutput);
  EXPECT_EQ(client->TakeAllgather(*h).status().code(), absl::StatusCode::kNotFound);
}

TEST(ClientTest, BarrierAndJoinWaitForTheirCompletion) {
  FakeDaemon daemon;
  std::unique_ptr<Client> client = daemon.Connect();
  std::optional<absl::StatusOr<int>> joined;
  std::thread t([&] { joined = client->Join(); });
  v1::LocalEnqueue e = daemon.NextEnqueue();
  EXPECT_EQ(e.request().type(), v1::REQUEST_TYPE_JOIN);
  EXPECT_EQ(e.request().name(), "join.1");
  v1::LocalReply reply;
  reply.mutable_completion()->set_handle(e.handle());
  reply.mutable_completion()->set_last_joined_rank(3);
  daemon.Send(reply);
  t.join();
  ASSERT_TRUE(joined.has_value() && joined->ok());
  EXPECT_EQ(**joined, 3);
}

TEST(ClientTest, HandshakeRefusalsSayWhetherToRetry) {
  for (auto [status, retry] :
       {std::pair{absl::FailedPreconditionError("rank 1 of job-000007 is held by process 4242"),
                  false},
        std::pair{absl::UnavailableError("no job yet"), true}}) {
    int fds[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    std::thread daemon([&, status = status] {
      v1::LocalRequest hello;
      ASSERT_TRUE(ReadFrame(fds[0], &hello).ok());
      v1::LocalReply reply;
      reply.mutable_completion()->set_code(static_cast<int>(status.code()));
      reply.mutable_completion()->set_message(std::string(status.message()));
      ASSERT_TRUE(WriteFrame(fds[0], reply).ok());
    });
    bool should_retry = !retry;
    absl::StatusOr<std::unique_ptr<Client>> client = Handshake(fds[1], &should_retry);
    daemon.join();
    close(fds[0]);
    EXPECT_EQ(client.status(), status);
    EXPECT_EQ(should_retry, retry) << status;
  }
}

}  // namespace
}  // namespace ringmaster
