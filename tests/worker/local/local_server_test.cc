// The daemon's local protocol (LocalServer) with a recording handler and raw socket clients: what a
// training process may send before and after its welcome, which connection a disconnect belongs to,
// and that a refused set of ready events (a CPU slot's answer) closes only that connection.
#include "worker/local/local_server.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/framing.h"
#include "gtest/gtest.h"

namespace ringmaster {
namespace {

class RecordingHandler : public LocalServer::Handler {
 public:
  absl::StatusOr<Welcome> OnHello(const v1::LocalHello& hello,
                                  const PeerCredentials& peer) override {
    absl::MutexLock lock(&mu_);
    if (hello.pid() == 666) return absl::FailedPreconditionError("not you");
    Welcome w;
    w.message.set_job_id("job-7");
    w.message.set_epoch(3);
    w.message.set_rank(1);
    return w;
  }
  void OnEnqueue(const v1::LocalWelcome* welcome, const v1::LocalEnqueue& enqueue,
                 std::function<void(const v1::LocalCompletion&)> reply) override {
    {
      absl::MutexLock lock(&mu_);
      acted.push_back(welcome == nullptr ? "enqueue without a welcome" : "enqueue");
    }
    v1::LocalCompletion c;
    c.set_handle(enqueue.handle());
    c.set_message(enqueue.request().name());
    reply(c);
  }
  void OnRelease(const v1::LocalWelcome* welcome, const v1::LocalRelease& release) override {
    absl::MutexLock lock(&mu_);
    acted.push_back(welcome == nullptr ? "release without a welcome" : "release");
  }
  absl::Status OnReadyEvents(const v1::LocalReadyEvents& events) override {
    absl::MutexLock lock(&mu_);
    ready_events.push_back(events.handles_size());
    return refuse_ready_events ? absl::FailedPreconditionError("a CPU slot") : absl::OkStatus();
  }
  void OnDisconnect(const v1::LocalWelcome* welcome) override {
    absl::MutexLock lock(&mu_);
    disconnects.push_back(
        welcome == nullptr ? "none" : absl::StrCat(welcome->job_id(), "@", welcome->epoch()));
  }

  std::vector<std::string> Disconnects(size_t at_least) {
    absl::MutexLock lock(&mu_);
    auto enough = [&] { return disconnects.size() >= at_least; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
    return disconnects;
  }

  absl::Mutex mu_;
  bool refuse_ready_events = false;
  std::vector<int> ready_events;
  std::vector<std::string> disconnects;
  std::vector<std::string> acted;  // enqueues and releases handed to the handler
};

class LocalServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = absl::StrCat(::testing::TempDir(), "/local-", getpid(), ".sock");
    absl::StatusOr<std::unique_ptr<LocalServer>> server = LocalServer::Start(path_, &handler_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  int Dial() {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    timeval timeout{10, 0};  // no read in this test waits forever
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    return fd;
  }

  static v1::LocalReply Hello(int fd, int pid) {
    v1::LocalRequest hello;
    hello.mutable_hello()->set_pid(pid);
    EXPECT_TRUE(WriteFrame(fd, hello).ok());
    v1::LocalReply reply;
    EXPECT_TRUE(ReadFrame(fd, &reply).ok());
    return reply;
  }

  static void SendReadyEvents(int fd, int n) {
    v1::LocalRequest m;
    for (int i = 0; i < n; ++i) m.mutable_ready_events()->add_handles(std::string(64, 'x'));
    ASSERT_TRUE(WriteFrame(fd, m).ok());
  }

  // The server closed this connection: a read ends (EOF or reset) instead of timing out.
  static bool Closed(int fd) {
    v1::LocalReply reply;
    const absl::Time start = absl::Now();
    const bool failed = !ReadFrame(fd, &reply).ok();
    return failed && absl::Now() - start < absl::Seconds(9);
  }

  static std::string Enqueue(int fd, uint64_t handle, const std::string& name) {
    v1::LocalRequest m;
    m.mutable_enqueue()->set_handle(handle);
    m.mutable_enqueue()->mutable_request()->set_name(name);
    EXPECT_TRUE(WriteFrame(fd, m).ok());
    v1::LocalReply reply;
    if (!ReadFrame(fd, &reply).ok()) return "closed";
    return absl::StrCat(reply.completion().handle(), ":", reply.completion().message());
  }

  RecordingHandler handler_;
  std::string path_;
  std::unique_ptr<LocalServer> server_;
};

TEST_F(LocalServerTest, ReadyEventsBeforeAWelcomeAreRefusedAndCloseTheConnection) {
  int fd = Dial();
  SendReadyEvents(fd, 4);
  v1::LocalReply refused;
  ASSERT_TRUE(ReadFrame(fd, &refused).ok());
  EXPECT_EQ(refused.completion().code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_TRUE(Closed(fd));
  close(fd);
  EXPECT_EQ(handler_.Disconnects(1), std::vector<std::string>{"none"});
  absl::MutexLock lock(&handler_.mu_);
  EXPECT_TRUE(handler_.ready_events.empty());
}

TEST_F(LocalServerTest, AWelcomedProcessSharesItsReadyEventsAndItsDisconnectNamesItsJob) {
  int fd = Dial();
  v1::LocalReply welcome = Hello(fd, 1234);
  ASSERT_EQ(welcome.kind_case(), v1::LocalReply::kWelcome);
  EXPECT_EQ(welcome.welcome().job_id(), "job-7");
  SendReadyEvents(fd, 3);
  EXPECT_EQ(Enqueue(fd, 42, "grad"), "42:grad");  // still served after its events
  close(fd);
  EXPECT_EQ(handler_.Disconnects(1), std::vector<std::string>{"job-7@3"});
  absl::MutexLock lock(&handler_.mu_);
  EXPECT_EQ(handler_.ready_events, std::vector<int>{3});
}

TEST_F(LocalServerTest, ASecondHelloOnAWelcomedConnectionIsRefused) {
  int fd = Dial();
  ASSERT_EQ(Hello(fd, 1234).kind_case(), v1::LocalReply::kWelcome);
  v1::LocalReply again = Hello(fd, 1234);
  ASSERT_EQ(again.kind_case(), v1::LocalReply::kCompletion);
  EXPECT_EQ(again.completion().code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(again.completion().message(), "this connection was already welcomed");
  EXPECT_EQ(Enqueue(fd, 5, "still served"), "5:still served");
  close(fd);
  EXPECT_EQ(handler_.Disconnects(1), std::vector<std::string>{"job-7@3"});  // one welcome, one end
}

TEST_F(LocalServerTest, RefusedReadyEventsCloseOnlyThatConnection) {
  handler_.refuse_ready_events = true;  // what a CPU slot answers
  int cuda_client = Dial();
  int other = Dial();
  ASSERT_EQ(Hello(cuda_client, 1).kind_case(), v1::LocalReply::kWelcome);
  ASSERT_EQ(Hello(other, 2).kind_case(), v1::LocalReply::kWelcome);
  SendReadyEvents(cuda_client, 2);
  EXPECT_TRUE(Closed(cuda_client));
  EXPECT_EQ(Enqueue(other, 7, "still here"), "7:still here");
  close(cuda_client);
  close(other);
  EXPECT_EQ(handler_.Disconnects(2), (std::vector<std::string>{"job-7@3", "job-7@3"}));
}

TEST_F(LocalServerTest, ARefusedHelloIsAnErrorAndClosesTheConnection) {
  int fd = Dial();
  v1::LocalReply reply = Hello(fd, 666);
  ASSERT_EQ(reply.kind_case(), v1::LocalReply::kCompletion);
  EXPECT_EQ(reply.completion().code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(reply.completion().message(), "not you");
  // Whatever it sends next is never acted on: the connection is closed.
  v1::LocalRequest m;
  m.mutable_enqueue()->set_handle(9);
  m.mutable_enqueue()->mutable_request()->set_name("overwrite.the.rank");
  WriteFrame(fd, m).IgnoreError();  // may fail: the server closed it already
  EXPECT_TRUE(Closed(fd));
  close(fd);
  EXPECT_EQ(handler_.Disconnects(1), std::vector<std::string>{"none"});
  absl::MutexLock lock(&handler_.mu_);
  EXPECT_TRUE(handler_.acted.empty());
}

// Every message but a hello, sent before a welcome, is refused and closes the connection; the
// handler never sees it.
TEST_F(LocalServerTest, AnEnqueueBeforeAWelcomeIsRefusedAndClosesTheConnection) {
  int fd = Dial();
  v1::LocalRequest m;
  m.mutable_enqueue()->set_handle(17);
  m.mutable_enqueue()->mutable_request()->set_name("grad");
  ASSERT_TRUE(WriteFrame(fd, m).ok());
  v1::LocalReply reply;
  ASSERT_TRUE(ReadFrame(fd, &reply).ok());
  EXPECT_EQ(reply.completion().handle(), 17u);
  EXPECT_EQ(reply.completion().code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_EQ(reply.completion().message(),
            "this connection was not welcomed (its hello was refused or never sent): it may send "
            "nothing else; connect again and say hello");
  EXPECT_TRUE(Closed(fd));
  close(fd);
  EXPECT_EQ(handler_.Disconnects(1), std::vector<std::string>{"none"});
  absl::MutexLock lock(&handler_.mu_);
  EXPECT_TRUE(handler_.acted.empty());
}

TEST_F(LocalServerTest, AReleaseBeforeAWelcomeIsRefusedAndClosesTheConnection) {
  int fd = Dial();
  v1::LocalRequest m;
  m.mutable_release()->set_offset(4096);
  ASSERT_TRUE(WriteFrame(fd, m).ok());
  v1::LocalReply reply;
  ASSERT_TRUE(ReadFrame(fd, &reply).ok());
  EXPECT_EQ(reply.completion().code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_TRUE(Closed(fd));
  close(fd);
  EXPECT_EQ(handler_.Disconnects(1), std::vector<std::string>{"none"});
  absl::MutexLock lock(&handler_.mu_);
  EXPECT_TRUE(handler_.acted.empty());
}

}  // namespace
}  // namespace ringmaster
