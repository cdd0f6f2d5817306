// The coordinator process: the Coordinator, its three gRPC services on one server, and the ticker
// thread that flushes negotiation cycles and runs housekeeping. Used by main() and by in-process
// tests.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/certificate_trust.h"
#include "common/executor.h"
#include "common/metrics.h"
#include "common/metrics_server.h"
#include "common/tls.h"
#include "coordinator/coordinator.h"
#include "coordinator/principal.h"

namespace grpc {
class Server;
}

namespace ringmaster {

class Authenticator;
class UnknownMethods;
class ClusterService;
class JobService;
class WorkerService;
class RendezvousService;

// Who may reach the coordinator, and how they prove who they are (docs/security.md).
struct ServerSecurity {
  TlsFiles tls;            // !tls.enabled(): plaintext
  std::string token_file;  // Kubernetes static token file of users' bearer tokens; "": none
  std::string admin_group = kDefaultAdminGroup;
  std::string worker_group = kDefaultWorkerGroup;
  // Plaintext on an address other than loopback (anyone who reaches it may run commands on every
  // worker): refused unless this is set, and then warned about in the log every minute.
  bool insecure_allow_remote = false;
};

// Whether `address` ("host:port", "[v6]:port") names a loopback host: 127.0.0.0/8, ::1, localhost.
bool IsLoopbackAddress(const std::string& address);

// Whether `security` allows serving on `address`: INVALID_ARGUMENT for unusable TLS files;
// FAILED_PRECONDITION for plaintext off loopback without insecure_allow_remote, or bearer tokens in
// plaintext off loopback.
absl::Status CheckListenSecurity(const ServerSecurity& security, const std::string& address);

// What a coordinator replica that does not lead serves while it waits to (--store etcd://, several
// replicas): every call on the coordinator's address is answered UNAVAILABLE naming the leader,
// in the message and in the x-ringmaster-leader trailer, so that clients given several addresses
// go to it; /healthz is OK and /readyz is not (a Kubernetes Service sends it nothing).
class FollowerServer {
 public:
  // `leader()` names the leader's address ("" when none is known yet); called on gRPC's threads.
  // `metrics_address` "" serves no probes. Errors as CoordinatorServer::Start.
  static absl::StatusOr<std::unique_ptr<FollowerServer>> Start(
      const std::string& address, const ServerSecurity& security,
      std::function<std::string()> leader, const std::string& metrics_address = "");
  ~FollowerServer();  // Stop()s

  int port() const { return port_; }
  int metrics_port() const;
  // Stops answering and frees the addresses (the replica is about to serve as the leader).
  void Stop();

 private:
  FollowerServer() = default;
  class Refusals;
  std::unique_ptr<Refusals> refusals_;
  std::unique_ptr<grpc::Server> server_;
  MetricsRegistry metrics_;
  std::unique_ptr<MetricsServer> metrics_server_;
  int port_ = 0;
};

class CoordinatorServer {
 public:
  explicit CoordinatorServer(CoordinatorOptions options, ServerSecurity security = {});
  ~CoordinatorServer();  // Stop()s

  // Listens on `address` ("host:port"; port 0 picks one) and starts the ticker. Returns the port.
  // UNAVAILABLE when the address cannot be bound; INVALID_ARGUMENT for unusable TLS files or token
  // file; FAILED_PRECONDITION for plaintext on a non-loopback address without
  // insecure_allow_remote. With `unix_path`, also serves on a Unix socket there (same credentials
  // and authentication; the socket reaches only this machine, as loopback does).
  absl::StatusOr<int> Start(const std::string& address, const std::string& unix_path = "");

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
  // Code archives arriving (SubmitJob) and going to workers, ranks' output arriving: file I/O of
  // its own, so an upload being checked never delays a download.
  std::unique_ptr<SerialExecutor> files_;
  std::unique_ptr<Coordinator> coordinator_;
  const ServerSecurity security_;
  // Made by Start(), with the services that borrow it.
  std::unique_ptr<Authenticator> authenticator_;
  std::unique_ptr<JobService> job_service_;
  // The CA bundle as it is now, to end sessions of certificates it no longer trusts (TLS only).
  std::unique_ptr<CertificateTrust> trust_;
  std::unique_ptr<WorkerService> worker_service_;
  std::unique_ptr<RendezvousService> rendezvous_service_;
  std::unique_ptr<ClusterService> cluster_service_;
  // Answers a call to a method the coordinator does not serve, naming it and the services there
  // are.
  std::unique_ptr<UnknownMethods> unknown_methods_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<MetricsServer> metrics_server_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> serving_{false};           // the gRPC server is listening
  std::atomic<int64_t> last_tick_unix_ns_{0};  // the ticker's last round (/healthz)
  // Set when serving plaintext on a non-loopback address: the ticker warns every minute.
  std::string insecure_remote_address_;
  std::thread ticker_;
};

}  // namespace ringmaster
