// RendezvousClient against a scripted RendezvousService on loopback: what it retries.
#include "worker/rendezvous/rendezvous_client.h"

#include <deque>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "common/coordinator_channels.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "ringmaster/v1/rendezvous.grpc.pb.h"

namespace ringmaster {
namespace {

// Answers each Set with the next scripted status (OK once the script is used up).
class ScriptedRendezvous final : public v1::RendezvousService::Service {
 public:
  explicit ScriptedRendezvous(std::deque<grpc::Status> script) : script_(std::move(script)) {}

  grpc::Status Set(grpc::ServerContext*, const v1::SetRequest* request, v1::SetResponse*) override {
    absl::MutexLock lock(&mu_);
    ++calls_;
    last_key_ = request->key();
    if (script_.empty()) return grpc::Status::OK;
    grpc::Status s = script_.front();
    script_.pop_front();
    return s;
  }

  int calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

 private:
  absl::Mutex mu_;
  std::deque<grpc::Status> script_ ABSL_GUARDED_BY(mu_);
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_key_ ABSL_GUARDED_BY(mu_);
};

class RendezvousClientTest : public ::testing::Test {
 protected:
  void Serve(std::deque<grpc::Status> script) {
    service_ = std::make_unique<ScriptedRendezvous>(std::move(script));
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  std::unique_ptr<RendezvousClient> Client() {
    absl::StatusOr<std::unique_ptr<CoordinatorChannels>> channels = CoordinatorChannels::Create(
        "127.0.0.1:" + std::to_string(port_), grpc::InsecureChannelCredentials());
    EXPECT_TRUE(channels.ok()) << channels.status();
    return std::make_unique<RendezvousClient>(
        std::shared_ptr<CoordinatorChannels>(*std::move(channels)), "job-000001", 1);
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  std::unique_ptr<ScriptedRendezvous> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

TEST_F(RendezvousClientTest, ACallTheServerCancelledOrCouldNotServeIsMadeAgain) {
  // A replica shutting its server down cancels its calls in flight; an unreachable one is
  // UNAVAILABLE: neither is the rendezvous' answer.
  Serve({grpc::Status(grpc::StatusCode::CANCELLED, ""),
         grpc::Status(grpc::StatusCode::UNAVAILABLE, "not the leader")});
  EXPECT_TRUE(Client()->Set("nccl/0/unique_id", "id").ok());
  EXPECT_EQ(service_->calls(), 3);
}

TEST_F(RendezvousClientTest, TheServersRefusalIsReturnedAsItIs) {
  Serve({grpc::Status(grpc::StatusCode::ABORTED, "job job-000001 ended: cancelled")});
  absl::Status s = Client()->Set("nccl/0/unique_id", "id");
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(service_->calls(), 1);
}

}  // namespace
}  // namespace ringmaster
