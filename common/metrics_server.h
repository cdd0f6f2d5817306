// Serves a MetricsRegistry at /metrics over HTTP (cpp-httplib), for Prometheus to scrape, and the
// health probes Kubernetes and load balancers ask: /healthz (the process is alive) and /readyz (it
// can do its work). Each answers 200 "ok" or 503 with the reason.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/metrics.h"

namespace httplib {
class Server;
}

namespace ringmaster {

struct HealthChecks {
  // Each returns OK, or why not (its message is the 503's body). Unset: always OK. Called on the
  // server's threads: they must be thread-safe and quick.
  std::function<absl::Status()> live;
  std::function<absl::Status()> ready;
};

class MetricsServer {
 public:
  // Listens on `address` ("host:port"; port 0 picks one). `registry` is borrowed and must outlive
  // the server. UNAVAILABLE when the address cannot be bound; INVALID_ARGUMENT when it is
  // malformed.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& address,
                                                              MetricsRegistry* registry,
                                                              HealthChecks health = {});
  ~MetricsServer();

  int port() const { return port_; }

 private:
  MetricsServer() = default;

  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace ringmaster
