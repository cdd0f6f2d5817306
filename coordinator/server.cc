#include "coordinator/server.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/bind_probe.h"
#include "coordinator/service/cluster_service.h"
#include "coordinator/service/job_service.h"
#include "coordinator/service/rendezvous_service.h"
#include "coordinator/service/worker_service.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"

namespace ringmaster {

// The ticker's period bounds how late a cycle-time flush can be; full readiness flushes at once.
// The ticker wakes at the next negotiation deadline, or after this long for housekeeping (leases,
// stalls, rendezvous timeouts, pending failures): it sleeps when there is nothing to do.
constexpr absl::Duration kMaxTickPeriod = absl::Milliseconds(10);

CoordinatorServer::CoordinatorServer(CoordinatorOptions options)
    : executor_(std::make_unique<SerialExecutor>()),
      reads_(std::make_unique<SerialExecutor>()),
      coordinator_(std::make_unique<Coordinator>([&] {
        if (options.executor == nullptr) options.executor = executor_.get();
        return std::move(options);
      }())),
      job_service_(std::make_unique<JobService>(*coordinator_, reads_.get())),
      worker_service_(std::make_unique<WorkerService>(*coordinator_)),
      rendezvous_service_(std::make_unique<RendezvousService>(*coordinator_)),
      cluster_service_(std::make_unique<ClusterService>(*coordinator_)) {}

CoordinatorServer::~CoordinatorServer() { Stop(); }

absl::StatusOr<int> CoordinatorServer::Start(const std::string& address) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
  // gRPC shares a port by default (SO_REUSEPORT): a second coordinator on a port in use would
  // listen too, and clients would reach one or the other at random.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Keepalive both ways. The coordinator pings every connection every 2 s and drops one whose ping
  // goes unanswered for 3 s: a worker host that went silent (its link down, its machine gone) is
  // found within 5 s, and with the 2 s reconnect grace its job fails within about 7 s, naming it.
  // A ping is a few bytes; a worker under load answers it from gRPC's own threads. It accepts the
  // workers' pings every 10 s even without data (gRPC's default, 5 min, would answer them with
  // GOAWAY "too_many_pings").
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 2'000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 3'000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5'000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  builder.RegisterService(job_service_.get());
  builder.RegisterService(worker_service_.get());
  builder.RegisterService(rendezvous_service_.get());
  builder.RegisterService(cluster_service_.get());
  builder.SetMaxReceiveMessageSize(64 << 20);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port == 0) {
    server_.reset();
    const std::string why = BindError(address);
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", address, ": ", why.empty() ? "gRPC could not bind it" : why,
        why == "Address already in use"
            ? " (another process, e.g. a ringmaster-coordinator, listens there; choose another "
              "address with --listen)"
            : ""));
  }
  last_tick_unix_ns_.store(absl::GetCurrentTimeNanos());
  ticker_ = std::thread([this] { TickLoop(); });
  serving_.store(true);
  return port;
}

absl::StatusOr<int> CoordinatorServer::StartMetrics(const std::string& address) {
  absl::StatusOr<std::unique_ptr<MetricsServer>> server = MetricsServer::Start(
      address, &coordinator_->metrics(),
      HealthChecks{
          // Alive while its ticker (leases, deadlines, scheduling) goes round: a coordinator
          // wedged on a lock for 30 s is restarted.
          .live =
              [this] {
                const absl::Duration since =
                    absl::Nanoseconds(absl::GetCurrentTimeNanos() - last_tick_unix_ns_.load());
                if (!serving_.load() || since < absl::Seconds(30)) return absl::OkStatus();
                return absl::UnavailableError(absl::StrCat(
                    "the coordinator's ticker has not run for ", absl::FormatDuration(since)));
              },
          // Ready once its gRPC port listens (jobs restored), and no longer while it stops.
          .ready =
              [this] {
                if (stopping_.load()) return absl::UnavailableError("the coordinator is stopping");
                if (!serving_.load()) return absl::UnavailableError("not listening yet");
                return absl::OkStatus();
              },
      });
  if (!server.ok()) return server.status();
  metrics_server_ = *std::move(server);
  return metrics_server_->port();
}

void CoordinatorServer::TickLoop() {
  while (!stopping_.load(std::memory_order_acquire)) {
    coordinator_->Tick();
    last_tick_unix_ns_.store(absl::GetCurrentTimeNanos());
    coordinator_->WaitForTick(std::min(coordinator_->NextDeadline(), absl::Now() + kMaxTickPeriod));
  }
}

void CoordinatorServer::Stop(absl::Duration grace) {
  if (stopping_.exchange(true)) return;
  if (coordinator_ != nullptr) coordinator_->WakeTicker(absl::InfinitePast());
  if (ticker_.joinable()) ticker_.join();
  metrics_server_.reset();
  if (server_ != nullptr) {
    coordinator_->Shutdown("coordinator is shutting down");
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::milliseconds(absl::ToInt64Milliseconds(grace)));
    server_->Wait();
  }
  // What the calls and the ticker handed over (ending jobs, closing their files, artifact reads) is
  // done now.
  reads_->Shutdown();
  executor_->Shutdown();
}

}  // namespace ringmaster
