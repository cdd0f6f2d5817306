// The worker's session with the coordinator never blocks a sender for longer than its write
// timeout: against a coordinator that accepts the session but stops reading, a write that cannot
// complete cancels the session within the timeout and the sender gets UNAVAILABLE.
#include "worker/negotiation/coordinator_session.h"

#include <memory>
#include <string>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "ringmaster/v1/worker.grpc.pb.h"

namespace ringmaster {
namespace {

namespace v1 = ringmaster::v1;

// Registers every worker, accepts its session, and never reads from it.
class DeafCoordinator final : public v1::WorkerService::CallbackService {
 public:
  grpc::ServerUnaryReactor* RegisterWorker(grpc::CallbackServerContext* context,
                                           const v1::RegisterWorkerRequest*,
                                           v1::RegisterWorkerResponse* response) override {
    response->set_worker_id("worker-1");
    response->set_lease_ms(60'000);
    response->set_heartbeat_interval_ms(60'000);
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage>* Session(
      grpc::CallbackServerContext*) override {
    class Deaf : public grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorMessage> {
     public:
      void OnCancel() override { Finish(grpc::Status::CANCELLED); }
      void OnDone() override { delete this; }
    };
    ++sessions;
    return new Deaf;
  }

  std::atomic<int> sessions{0};
};

class NoListener : public CoordinatorSession::Listener {
 public:
  void OnMessage(const v1::CoordinatorMessage&) override {}
  void OnSessionLost(const absl::Status&, bool) override {}
};

TEST(CoordinatorSessionTest, AWriteTheCoordinatorNeverTakesFailsWithinTheWriteTimeout) {
  DeafCoordinator service;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);

  NoListener listener;
  v1::RegisterWorkerRequest registration;
  registration.set_host("host-a");
  registration.set_device("cpu");
  CoordinatorSession session(*CoordinatorChannels::Create(absl::StrCat("127.0.0.1:", port),
                                                          grpc::InsecureChannelCredentials()),
                             registration, &listener, absl::Seconds(1));
  session.Start();
  const absl::Time connect_deadline = absl::Now() + absl::Seconds(10);
  while (!session.connected() && absl::Now() < connect_deadline)
    absl::SleepFor(absl::Milliseconds(10));
  ASSERT_TRUE(session.connected());

  // 1 MiB messages until flow control stops them: one write then blocks, and must fail.
  v1::WorkerMessage big;
  big.mutable_output()->set_data(std::string(1 << 20, 'x'));
  absl::Status status;
  absl::Duration longest;
  const absl::Time start = absl::Now();
  for (int i = 0; i < 200 && status.ok(); ++i) {
    const absl::Time before = absl::Now();
    status = session.Send(big);
    longest = std::max(longest, absl::Now() - before);
  }
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_LT(longest, absl::Seconds(3)) << "a Send blocked for " << longest;
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  // The session reconnects after the cancelled one.
  const absl::Time reconnect_deadline = absl::Now() + absl::Seconds(10);
  while (service.sessions < 2 && absl::Now() < reconnect_deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_GE(service.sessions.load(), 2);
  const absl::Time stop_start = absl::Now();
  session.Stop();
  EXPECT_LT(absl::Now() - stop_start, absl::Seconds(3));
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

}  // namespace
}  // namespace ringmaster
