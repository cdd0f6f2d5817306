// The worker daemon's job lifecycle against a fake coordinator (a WorkerService on loopback that
// records what the daemon sends and lets the test send assignments and stops): registration and
// the session, a command run as the rank (its topology in the environment, its output forwarded,
// its exit status reported), a training process that attaches to the socket (welcomed with its
// rank; its disconnect ends the rank), and a stop that terminates the rank.
#include "worker/daemon.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/framing.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "ringmaster/client.h"
#include "ringmaster/v1/worker.grpc.pb.h"

namespace ringmaster {
namespace {

// Registers the daemon as worker-7 and keeps its one session: messages from the daemon are queued
// for the test (heartbeats left out), messages to it written in order.
class FakeCoordinator final : public v1::WorkerService::CallbackService {
 public:
  grpc::ServerUnaryReactor* RegisterWorker(grpc::CallbackServerContext* context,
                                           const v1::RegisterWorkerRequest* request,
                                           v1::RegisterWorkerResponse* response) override {
    {
      absl::MutexLock lock(&mu_);
      registrations_.push_back(*request);
    }
    response->set_worker_id("worker-7");
    response->set_lease_ms(60'000);
    response->set_heartbeat_interval_ms(1'000);
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage>* Session(
      grpc::CallbackServerContext*) override {
    return new SessionReactor(this);
  }

  // The next message from the daemon (not a heartbeat) within 20 s.
  std::optional<v1::WorkerMessage> Next() {
    absl::MutexLock lock(&mu_);
    auto any = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !received_.empty(); };
    if (!mu_.AwaitWithTimeout(absl::Condition(&any), absl::Seconds(20))) return std::nullopt;
    v1::WorkerMessage m = std::move(received_.front());
    received_.pop_front();
    return m;
  }
  // Skips messages until a rank update; nullopt when none came.
  std::optional<v1::RankUpdate> NextUpdate(std::string* output = nullptr) {
    while (std::optional<v1::WorkerMessage> m = Next()) {
      if (m->has_rank_update()) return m->rank_update();
      if (m->has_output() && output != nullptr) *output += m->output().data();
    }
    return std::nullopt;
  }

  void Send(v1::CoordinatorMessage m) {
    absl::MutexLock lock(&mu_);
    auto open = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return session_ != nullptr; };
    ASSERT_TRUE(mu_.AwaitWithTimeout(absl::Condition(&open), absl::Seconds(20)));
    outbox_.push_back(std::move(m));
    if (!writing_) WriteNextLocked();
  }

  std::vector<v1::RegisterWorkerRequest> registrations() {
    absl::MutexLock lock(&mu_);
    return registrations_;
  }

 private:
  class SessionReactor : public grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage> {
   public:
    explicit SessionReactor(FakeCoordinator* fake) : fake_(fake) {
      {
        absl::MutexLock lock(&fake_->mu_);
        fake_->session_ = this;
      }
      StartRead(&in_);
    }
    void OnReadDone(bool ok) override {
      if (!ok) {
        Finish(grpc::Status::OK);
        return;
      }
      if (!in_.has_heartbeat()) {
        absl::MutexLock lock(&fake_->mu_);
        fake_->received_.push_back(in_);
      }
      StartRead(&in_);
    }
    void OnWriteDone(bool /*ok*/) override {
      absl::MutexLock lock(&fake_->mu_);
      fake_->outbox_.pop_front();
      fake_->writing_ = false;
      fake_->WriteNextLocked();
    }
    void OnDone() override {
      {
        absl::MutexLock lock(&fake_->mu_);
        if (fake_->session_ == this) fake_->session_ = nullptr;
      }
      delete this;
    }

   private:
    FakeCoordinator* const fake_;
    v1::WorkerMessage in_;
  };

  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (outbox_.empty() || session_ == nullptr) return;
    writing_ = true;
    session_->StartWrite(&outbox_.front());
  }

  absl::Mutex mu_;
  std::vector<v1::RegisterWorkerRequest> registrations_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::WorkerMessage> received_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::CoordinatorMessage> outbox_ ABSL_GUARDED_BY(mu_);  // front: being written
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  SessionReactor* session_ ABSL_GUARDED_BY(mu_) = nullptr;
};

class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&coordinator_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    DaemonOptions o;
    o.coordinator = absl::StrCat("127.0.0.1:", port_);
    o.host_name = "host-t";
    o.socket_path = absl::StrCat(::testing::TempDir(), "daemon-test-", getpid(), ".sock");
    socket_ = o.socket_path;
    o.arena_bytes = 1 << 20;
    o.stop_grace = absl::Seconds(2);
    o.collective_timeout = absl::Seconds(2);
    o.coordinator_grace = absl::Seconds(1);
    Configure(o);
    daemon_ = std::make_unique<Daemon>(o);
    ASSERT_TRUE(daemon_->Start().ok());
    runner_ = std::thread([this] { daemon_->Run(); });
    std::optional<v1::WorkerMessage> open = coordinator_.Next();
    ASSERT_TRUE(open.has_value() && open->has_open()) << "no session opened";
    EXPECT_EQ(open->open().worker_id(), "worker-7");
  }
  void TearDown() override {
    daemon_->Shutdown();
    if (runner_.joinable()) runner_.join();
    daemon_.reset();
    if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  }

  virtual void Configure(DaemonOptions& /*options*/) {}

  // The rank's process id, which the command writes to `file` first.
  static pid_t ReadPid(const std::string& file) {
    pid_t pid = 0;
    for (int i = 0; i < 200 && pid == 0; ++i) {
      if (FILE* f = std::fopen(file.c_str(), "r")) {
        if (std::fscanf(f, "%d", &pid) != 1) pid = 0;
        std::fclose(f);
      }
      if (pid == 0) absl::SleepFor(absl::Milliseconds(10));
    }
    return pid;
  }

  // Assigns rank 0 of a one-rank job running `command` (none: a process attaches) to the daemon.
  void Assign(std::vector<std::string> command, const std::string& id = "job-000042") {
    v1::CoordinatorMessage m;
    v1::JobAssignment* a = m.mutable_assignment();
    a->set_rank(0);
    a->set_epoch(1);
    v1::Job* job = a->mutable_job();
    job->set_id(id);
    job->set_epoch(1);
    job->mutable_spec()->set_np(1);
    for (std::string& c : command) job->mutable_spec()->add_command(std::move(c));
    v1::RankInfo* r = job->add_ranks();
    r->set_rank(0);
    r->set_worker_id("worker-7");
    r->set_host("host-t");
    r->set_device("cpu");
    r->set_local_size(1);
    r->set_cross_size(1);
    coordinator_.Send(std::move(m));
  }

  FakeCoordinator coordinator_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::string socket_;
  std::unique_ptr<Daemon> daemon_;
  std::thread runner_;
};

// A connection to the daemon's socket: -errno when it cannot connect.
int ConnectTo(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int error = errno;
    close(fd);
    return -error;
  }
  return fd;
}

// Says hello on a new connection, claiming `pid` (and rank `attach_rank` of the attached job
// `attach_job`, if given); the reply's completion (the error) or "welcome".
std::string RawHello(const std::string& path, int pid, const std::string& attach_job = "",
                     int attach_rank = 0) {
  const int fd = ConnectTo(path);
  if (fd < 0) return absl::StrCat("connect: errno ", -fd);
  v1::LocalRequest hello;
  hello.mutable_hello()->set_pid(pid);
  hello.mutable_hello()->set_attach_job(attach_job);
  hello.mutable_hello()->set_attach_rank(attach_rank);
  v1::LocalReply reply;
  std::string out;
  if (!WriteFrame(fd, hello).ok() || !ReadFrame(fd, &reply).ok()) {
    out = "no reply";
  } else if (reply.has_welcome()) {
    out = "welcome";
  } else {
    out = absl::StrCat(reply.completion().code(), ": ", reply.completion().message());
  }
  close(fd);
  return out;
}

// What `f` returns, run in a child process of uid and gid 65534 (nobody).
std::string AsNobody(const std::function<std::string()>& f) {
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return "pipe";
  const pid_t child = fork();
  if (child == 0) {
    close(pipe_fds[0]);
    std::string r = setgid(65534) == 0 && setuid(65534) == 0 ? f() : std::string("setuid failed");
    (void)!write(pipe_fds[1], r.data(), r.size());
    _exit(0);
  }
  close(pipe_fds[1]);
  std::string result;
  char buffer[512];
  for (ssize_t n; (n = read(pipe_fds[0], buffer, sizeof(buffer))) > 0;) result.append(buffer, n);
  close(pipe_fds[0]);
  waitpid(child, nullptr, 0);
  return result;
}

// In a child process of uid and gid 65534 (nobody): `RawHello(path, getpid())` or the connect
// error.
std::string HelloAsNobody(const std::string& path) {
  return AsNobody([&path] { return RawHello(path, getpid()); });
}

// Says hello claiming `pid`; once refused, sends `kind` ("enqueue", "release" or "ready") on the
// same connection, as a process the daemon did not admit might: "refused (REFUSAL), then closed"
// when the daemon closes the connection instead of acting on it.
std::string RefusedThenSend(const std::string& path, int pid, const std::string& kind) {
  const int fd = ConnectTo(path);
  if (fd < 0) return absl::StrCat("connect: errno ", -fd);
  timeval timeout{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  v1::LocalRequest hello;
  hello.mutable_hello()->set_pid(pid);
  v1::LocalReply reply;
  if (!WriteFrame(fd, hello).ok() || !ReadFrame(fd, &reply).ok()) {
    close(fd);
    return "no reply to the hello";
  }
  if (reply.has_welcome()) {
    close(fd);
    return "welcomed";
  }
  const std::string refusal = absl::StrCat(reply.completion().code());
  v1::LocalRequest m;
  if (kind == "enqueue") {
    m.mutable_enqueue()->set_handle(7);
    m.mutable_enqueue()->mutable_request()->set_name("overwrite.the.rank");
    m.mutable_enqueue()->mutable_request()->set_type(v1::REQUEST_TYPE_ALLREDUCE);
    m.mutable_enqueue()->mutable_request()->set_dtype(v1::DATA_TYPE_FLOAT32);
    m.mutable_enqueue()->mutable_request()->add_shape(4);
  } else if (kind == "release") {
    m.mutable_release()->set_offset(0);
  } else {
    m.mutable_ready_events()->add_handles(std::string(64, 'x'));
  }
  WriteFrame(fd, m).IgnoreError();  // the daemon may have closed it already
  v1::LocalReply after;
  const bool closed = !ReadFrame(fd, &after).ok();
  close(fd);
  return closed ? absl::StrCat("refused (", refusal, "), then closed")
                : absl::StrCat("refused (", refusal, "), then answered: ", after.DebugString());
}

// A process refused at hello (a forged pid, a same-uid process that is not the rank's, another
// uid where the socket lets it connect) can send nothing else: every kind of message after the
// refusal finds the connection closed.
TEST_F(DaemonTest, AProcessRefusedAtHelloCanSendNothingElse) {
  Assign({"/bin/sleep", "30"});
  std::optional<v1::RankUpdate> started = coordinator_.NextUpdate();
  ASSERT_TRUE(started.has_value());
  for (const char* kind : {"enqueue", "release", "ready"}) {
    // Not rank 0's process (nor one it started), and a pid that is not the caller's.
    EXPECT_EQ(RefusedThenSend(socket_, getpid(), kind), "refused (7), then closed") << kind;
    EXPECT_EQ(RefusedThenSend(socket_, 1, kind), "refused (7), then closed") << kind;
  }
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a process as another user";
  ASSERT_EQ(chmod(socket_.c_str(), 0666), 0);  // as a shared --socket-group would let it in
  for (const char* kind : {"enqueue", "release", "ready"}) {
    const std::string path = socket_;
    EXPECT_EQ(AsNobody([&] { return RefusedThenSend(path, getpid(), kind); }),
              "refused (7), then closed")
        << kind;
  }
}

TEST_F(DaemonTest, TheSocketIsTheDaemonsUserAndGroupsOnly) {
  struct stat st {};
  ASSERT_EQ(stat(socket_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a process as another user";
  Assign({});
  // Another user cannot even connect...
  EXPECT_EQ(HelloAsNobody(socket_), absl::StrCat("connect: errno ", EACCES));
  // ...and where the socket is opened to it (a shared --socket-group), it is still not welcomed:
  // the kernel says who it is.
  ASSERT_EQ(chmod(socket_.c_str(), 0666), 0);
  EXPECT_EQ(HelloAsNobody(socket_),
            absl::StrCat("7: uid 65534 may not attach: this daemon serves the processes of its "
                         "own user (uid ",
                         geteuid(), "), root and --attach-uid's"));
}

// A daemon that welcomes uid 65534 too, its socket in gid 65534 (given as a number: no group entry
// is needed, as in a container).
class DaemonAttachUidTest : public DaemonTest {
 protected:
  void Configure(DaemonOptions& o) override {
    o.socket_group = "65534";
    o.attach_uids = {65534};
  }
};

TEST_F(DaemonAttachUidTest, AnotherUserNamedByAttachUidIsWelcomedThroughTheSocketGroup) {
  struct stat st {};
  ASSERT_EQ(stat(socket_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a process as another user";
  EXPECT_EQ(st.st_gid, 65534u);
  Assign({});
  std::string reply = HelloAsNobody(socket_);
  for (int i = 0; i < 200 && reply != "welcome"; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
    reply = HelloAsNobody(socket_);
  }
  EXPECT_EQ(reply, "welcome");
}

TEST_F(DaemonTest, AnAttachingProcessClaimsItsRankUntilTheJobIsPlacedOrTheClaimIsRefused) {
  // No job yet: the daemon claims the rank at the coordinator and says so.
  EXPECT_EQ(RawHello(socket_, getpid(), "train", 1),
            "14: rank 1 of attached job 'train' claimed on this worker: the job starts when all "
            "its ranks are claimed");
  std::optional<v1::WorkerMessage> claim = coordinator_.Next();
  ASSERT_TRUE(claim.has_value() && claim->has_claim());
  EXPECT_EQ(claim->claim().job_name(), "train");
  EXPECT_EQ(claim->claim().rank(), 1);
  // Not submitted yet: the process keeps waiting, told why.
  v1::CoordinatorMessage m;
  m.mutable_claim_refused()->set_job_name("train");
  m.mutable_claim_refused()->set_rank(1);
  m.mutable_claim_refused()->set_code(static_cast<int>(absl::StatusCode::kNotFound));
  m.mutable_claim_refused()->set_message("no attached job named 'train' is pending");
  coordinator_.Send(m);
  std::string reply;
  for (int i = 0; i < 100; ++i) {
    reply = RawHello(socket_, getpid(), "train", 1);
    if (reply !=
        "14: rank 1 of attached job 'train' claimed on this worker: the job starts when "
        "all its ranks are claimed") {
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(reply,
            "14: waiting for attached job 'train': no attached job named 'train' is pending");
  // Refused for good: the process is told so and stops waiting.
  m.mutable_claim_refused()->set_code(static_cast<int>(absl::StatusCode::kAlreadyExists));
  m.mutable_claim_refused()->set_message("rank 1 of job job-000042 is claimed by worker-3 already");
  coordinator_.Send(m);
  for (int i = 0; i < 100; ++i) {
    reply = RawHello(socket_, getpid(), "train", 1);
    if (absl::StartsWith(reply, "9: ")) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(reply, "9: rank 1 of job job-000042 is claimed by worker-3 already");
}

TEST_F(DaemonTest, AHelloMustCarryTheConnectingProcesssOwnPid) {
  Assign({});
  EXPECT_EQ(RawHello(socket_, 1),
            absl::StrCat("7: hello.pid 1 is not the connecting process's (pid ", getpid(), ")"));
  // The same process with its own pid is welcomed (once the assignment has reached the daemon),
  // and only then does the rank start.
  std::string reply = RawHello(socket_, getpid());
  for (int i = 0; i < 200 && reply != "welcome"; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
    reply = RawHello(socket_, getpid());
  }
  EXPECT_EQ(reply, "welcome");
  std::optional<v1::RankUpdate> started = coordinator_.NextUpdate();
  ASSERT_TRUE(started.has_value());
  EXPECT_EQ(started->state(), v1::RANK_STATE_STARTED);
}

TEST_F(DaemonTest, OnlyTheLaunchedProcessOrItsChildrenMayAttachToItsRank) {
  Assign({"/bin/sleep", "30"});
  std::optional<v1::RankUpdate> started = coordinator_.NextUpdate();
  ASSERT_TRUE(started.has_value());
  const std::string reply = RawHello(socket_, getpid());
  EXPECT_TRUE(
      absl::StartsWith(reply, absl::StrCat("7: pid ", getpid(), " is not rank 0's process (pid ")))
      << reply;
  EXPECT_TRUE(
      absl::EndsWith(reply, ") nor one it started: only the job's own processes may attach"))
      << reply;
  // The client library takes the refusal as final: it says so at once instead of retrying until
  // its connect timeout.
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(socket_, absl::Seconds(20));
  EXPECT_EQ(client.status().code(), absl::StatusCode::kPermissionDenied) << client.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(DaemonTest, RegistersItsHostAndDevice) {
  std::vector<v1::RegisterWorkerRequest> r = coordinator_.registrations();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].host(), "host-t");
  EXPECT_EQ(r[0].device(), "cpu");
}

TEST_F(DaemonTest, ACommandRunsAsTheRankWithItsOutputForwardedAndItsExitReported) {
  Assign({"/bin/sh", "-c",
          "echo rank $RINGMASTER_RANK of $RINGMASTER_SIZE on $RINGMASTER_HOSTNAME; exit 3"});
  // A quick process may print before its start is reported: the output counts either way.
  std::string output;
  std::optional<v1::RankUpdate> started = coordinator_.NextUpdate(&output);
  ASSERT_TRUE(started.has_value());
  EXPECT_EQ(started->job_id(), "job-000042");
  EXPECT_EQ(started->epoch(), 1);
  EXPECT_EQ(started->rank(), 0);
  EXPECT_EQ(started->state(), v1::RANK_STATE_STARTED);
  std::optional<v1::RankUpdate> exited = coordinator_.NextUpdate(&output);
  ASSERT_TRUE(exited.has_value());
  EXPECT_EQ(exited->state(), v1::RANK_STATE_EXITED);
  EXPECT_EQ(exited->exit_code(), 3);
  EXPECT_FALSE(exited->failed());
  // Forwarded before the exit is reported, so the coordinator has it when the job ends.
  EXPECT_EQ(output, "rank 0 of 1 on host-t\n");
}

TEST_F(DaemonTest, AnAttachingProcessIsWelcomedWithItsRankAndItsDisconnectEndsTheRank) {
  Assign({});
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(socket_, absl::Seconds(20));
  ASSERT_TRUE(client.ok()) << client.status();
  const Topology& t = (*client)->topology();
  EXPECT_EQ(t.job_id, "job-000042");
  EXPECT_EQ(t.rank, 0);
  EXPECT_EQ(t.size, 1);
  EXPECT_EQ(t.host, "host-t");
  EXPECT_EQ(t.device, -1);
  std::optional<v1::RankUpdate> started = coordinator_.NextUpdate();
  ASSERT_TRUE(started.has_value());
  EXPECT_EQ(started->state(), v1::RANK_STATE_STARTED);
  client->reset();  // the training process goes away
  std::optional<v1::RankUpdate> exited = coordinator_.NextUpdate();
  ASSERT_TRUE(exited.has_value());
  EXPECT_EQ(exited->state(), v1::RANK_STATE_EXITED);
  EXPECT_EQ(exited->exit_code(), 0);
}

TEST_F(DaemonTest, AStopTerminatesTheRankAndTheDaemonTakesTheNextJob) {
  const std::string pid_file = absl::StrCat(socket_, ".pid");
  Assign({"/bin/sh", "-c", absl::StrCat("echo $$ > ", pid_file, "; exec sleep 60")});
  std::optional<v1::RankUpdate> started = coordinator_.NextUpdate();
  ASSERT_TRUE(started.has_value());
  EXPECT_EQ(started->state(), v1::RANK_STATE_STARTED);
  const pid_t pid = ReadPid(pid_file);
  ASSERT_GT(pid, 0);
  const absl::Time stop_sent = absl::Now();
  v1::CoordinatorMessage stop;
  stop.mutable_stop_job()->set_job_id("job-000042");
  stop.mutable_stop_job()->set_reason("cancelled by the test");
  coordinator_.Send(stop);
  // The coordinator ended the job: the rank is terminated (SIGTERM, within the grace period) and
  // its exit reported (so the job's log ends without waiting out its linger); the daemon is free
  // for the next job only once it is gone.
  Assign({"/bin/true"}, "job-000043");
  std::optional<v1::RankUpdate> next = coordinator_.NextUpdate();
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->job_id(), "job-000042");
  EXPECT_EQ(next->state(), v1::RANK_STATE_EXITED);
  EXPECT_EQ(next->exit_code(), 128 + SIGTERM);
  next = coordinator_.NextUpdate();
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->job_id(), "job-000043");
  EXPECT_EQ(next->state(), v1::RANK_STATE_STARTED);
  EXPECT_LT(absl::Now() - stop_sent, absl::Seconds(2));
  EXPECT_NE(kill(pid, 0), 0) << "the stopped rank's process " << pid << " is still there";
  next = coordinator_.NextUpdate();
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->job_id(), "job-000043");
  EXPECT_EQ(next->state(), v1::RANK_STATE_EXITED);
  EXPECT_EQ(next->exit_code(), 0);
  std::remove(pid_file.c_str());
}

TEST_F(DaemonTest, ARankWhoseCoordinatorStaysAwayPastTheGraceIsStopped) {
  const std::string pid_file = absl::StrCat(socket_, ".grace.pid");
  Assign({"/bin/sh", "-c", absl::StrCat("echo $$ > ", pid_file, "; exec sleep 60")});
  std::optional<v1::RankUpdate> started = coordinator_.NextUpdate();
  ASSERT_TRUE(started.has_value());
  const pid_t pid = ReadPid(pid_file);
  ASSERT_GT(pid, 0);
  // The coordinator goes away for good: within the grace (1 s here) the rank keeps running...
  server_->Shutdown(absl::ToChronoTime(absl::Now()));
  server_.reset();
  const absl::Time gone = absl::Now();
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_EQ(kill(pid, 0), 0) << "stopped before the grace was over";
  // ...and after it, it is stopped.
  while (kill(pid, 0) == 0 && absl::Now() - gone < absl::Seconds(10)) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_NE(kill(pid, 0), 0) << "the rank's process " << pid << " outlived the grace";
  EXPECT_LT(absl::Now() - gone, absl::Seconds(5));
  std::remove(pid_file.c_str());
}

}  // namespace
}  // namespace ringmaster
