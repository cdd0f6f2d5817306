// The coordinator process: the Coordinator, its three gRPC services on one server, and the ticker
// thread that flushes negotiation cycles and runs housekeeping. Used by main() and by in-process
// tests.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/executor.h"
#include "common/metrics_server.h"
#include "coordinator/coordinator.h"

namespace grpc {
class Server;
}

namespace ringmaster {

class ClusterService;
class JobService;
class WorkerService;
class RendezvousService;

class CoordinatorServer {
 public:
  explicit CoordinatorServer(CoordinatorOptions options);
  ~CoordinatorServer();  // Stop()s

  // Listens on `address` ("host:port"; port 0 picks one) and starts the ticker. Returns the port.
  // UNAVAILABLE when the address cannot be bound.
  absl::StatusOr<int> Start(const std::string& address);

  // Serves the coordinator's metrics at http://ADDRESS/metrics; returns the port.
  absl::StatusOr<int> StartMetrics(const std::string& address);

  // Ends every worker's session UNAVAILABLE (the daemons stay up and reconnect), fails pending
  // rendezvous waits, stops the server (giving in-flight calls up to `grace` to finish), then runs
  // what was handed to the executor (ending jobs, closing their files). Idempotent.
  void Stop(absl::Duration grace = absl::Seconds(5));

  Coordinator& coordinator() { return *coordinator_; }

 private:
  void TickLoop();

  // Declared first: it runs the coordinator's slow work, so it must stop (Stop() drains it) before
  // the coordinator goes.
  std::unique_ptr<SerialExecutor> executor_;
  // Artifact listings and reads (file I/O) for JobService: its own thread, so a large download
  // never delays ending a job. Before the coordinator too: its tasks read the coordinator's store.
  std::unique_ptr<SerialExecutor> reads_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<JobService> job_service_;
  std::unique_ptr<WorkerService> worker_service_;
  std::unique_ptr<RendezvousService> rendezvous_service_;
  std::unique_ptr<ClusterService> cluster_service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<MetricsServer> metrics_server_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> serving_{false};           // the gRPC server is listening
  std::atomic<int64_t> last_tick_unix_ns_{0};  // the ticker's last round (/healthz)
  std::thread ticker_;
};

}  // namespace ringmaster
