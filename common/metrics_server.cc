#include "common/metrics_server.h"

#include <sys/socket.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/bind_probe.h"
#include "httplib.h"

namespace ringmaster {

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& address,
                                                                    MetricsRegistry* registry,
                                                                    HealthChecks health) {
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address '", address, "' is not HOST:PORT"));
  }
  std::string host = address.substr(0, colon);
  if (host.empty()) host = "0.0.0.0";
  auto server = std::unique_ptr<MetricsServer>(new MetricsServer());
  server->server_ = std::make_unique<httplib::Server>();
  // cpp-httplib's default sets SO_REUSEPORT, with which a second server on a port in use would
  // share it silently; SO_REUSEADDR alone lets a restarted server bind while old connections
  // linger.
  server->server_->set_socket_options([](int fd) {
    const int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  server->server_->Get("/metrics", [registry](const httplib::Request&, httplib::Response& res) {
    res.set_content(registry->Exposition(), "text/plain; version=0.0.4; charset=utf-8");
  });
  auto probe = [](std::function<absl::Status()> check) {
    return [check = std::move(check)](const httplib::Request&, httplib::Response& res) {
      const absl::Status s = check ? check() : absl::OkStatus();
      res.status = s.ok() ? 200 : 503;
      res.set_content(s.ok() ? "ok\n" : absl::StrCat(s.message(), "\n"), "text/plain");
    };
  };
  server->server_->Get("/healthz", probe(std::move(health.live)));
  server->server_->Get("/readyz", probe(std::move(health.ready)));
  server->server_->Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(
        "<a href=\"/metrics\">/metrics</a> <a href=\"/healthz\">/healthz</a> "
        "<a href=\"/readyz\">/readyz</a>\n",
        "text/html");
  });
  server->port_ = port == 0 ? server->server_->bind_to_any_port(host.c_str())
                            : (server->server_->bind_to_port(host.c_str(), port) ? port : -1);
  if (server->port_ <= 0) {
    const std::string why = BindError(address);
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", address, ": ",
                                               why.empty() ? "bind failed" : why,
                                               " (choose another address with --metrics-listen)"));
  }
  httplib::Server* raw = server->server_.get();
  server->thread_ = std::thread([raw] { raw->listen_after_bind(); });
  return server;
}

MetricsServer::~MetricsServer() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace ringmaster
