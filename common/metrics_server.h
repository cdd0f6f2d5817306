// Serves a MetricsRegistry at /metrics over HTTP (cpp-httplib), for Prometheus to scrape.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/metrics.h"

namespace httplib {
class Server;
}

namespace ringmaster {

class MetricsServer {
 public:
  // Listens on `address` ("host:port"; port 0 picks one). `registry` is borrowed and must outlive
  // the server. UNAVAILABLE when the address cannot be bound; INVALID_ARGUMENT when it is
  // malformed.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& address,
                                                              MetricsRegistry* registry);
  ~MetricsServer();

  int port() const { return port_; }

 private:
  MetricsServer() = default;

  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace ringmaster
