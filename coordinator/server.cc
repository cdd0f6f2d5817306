#include "coordinator/server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <chrono>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/bind_probe.h"
#include "common/rpc_metadata.h"
#include "coordinator/service/auth.h"
#include "coordinator/service/cluster_service.h"
#include "coordinator/service/job_service.h"
#include "coordinator/service/rendezvous_service.h"
#include "coordinator/service/worker_service.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/server_interceptor.h"
#include "spdlog/spdlog.h"

namespace ringmaster {

// gRPC's own answer to an unknown method is UNIMPLEMENTED with no message; this one says what was
// asked for and what is served (a client built from another version of the protos, a wrong port).
class UnknownMethods final : public grpc::CallbackGenericService {
 public:
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    class Refusal : public grpc::ServerGenericBidiReactor {
     public:
      explicit Refusal(std::string method) {
        Finish(grpc::Status(
            grpc::StatusCode::UNIMPLEMENTED,
            absl::StrCat(
                "unknown method '", method.substr(0, 256),
                "': this is a ringmaster-coordinator, serving ringmaster.v1.JobService, "
                "WorkerService, RendezvousService and ClusterService (proto/ringmaster/v1)")));
      }
      void OnDone() override { delete this; }
    };
    return new Refusal(ctx->method());
  }
};

// gRPC answers a request whose bytes do not parse as the method's message itself, before any
// handler runs, with UNIMPLEMENTED and no message (nothing is done). This says what it was: the
// caller's bad input. Only calls with one request (unary, server-streaming): the session stream
// takes raw bytes and parses each message itself (service/worker_service.cc), and is left free of
// interception.
class MalformedRequests final : public grpc::experimental::Interceptor {
 public:
  explicit MalformedRequests(std::string method) : method_(std::move(method)) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status status = methods->GetSendStatus();
      if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED &&
          status.error_message().empty()) {
        methods->ModifySendStatus(grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("the request to ", method_.substr(0, 256),
                         " does not parse as that method's request message (proto/ringmaster/v1); "
                         "nothing was done")));
      }
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
};

class MalformedRequestsFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    using Type = grpc::experimental::ServerRpcInfo::Type;
    if (info->type() != Type::UNARY && info->type() != Type::SERVER_STREAMING) return nullptr;
    return new MalformedRequests(info->method());
  }
};

// Every call to a replica that does not lead: UNAVAILABLE naming the leader.
class FollowerServer::Refusals final : public grpc::CallbackGenericService {
 public:
  explicit Refusals(std::function<std::string()> leader) : leader_(std::move(leader)) {}

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    class Refusal : public grpc::ServerGenericBidiReactor {
     public:
      Refusal(grpc::GenericCallbackServerContext* ctx, const std::string& leader) {
        if (!leader.empty()) ctx->AddTrailingMetadata(kLeaderMetadata, leader);
        Finish(grpc::Status(
            grpc::StatusCode::UNAVAILABLE,
            leader.empty()
                ? std::string("this ringmaster-coordinator replica is not the leader, and no "
                              "leader is elected yet: try again in a moment")
                : absl::StrCat("this ringmaster-coordinator replica is not the leader; the leader "
                               "is at ",
                               leader)));
      }
      void OnDone() override { delete this; }
    };
    return new Refusal(ctx, leader_());
  }

 private:
  const std::function<std::string()> leader_;
};

// The ticker's period bounds how late a cycle-time flush can be; full readiness flushes at once.
// The ticker wakes at the next negotiation deadline, or after this long for housekeeping (leases,
// stalls, rendezvous timeouts, pending failures): it sleeps when there is nothing to do.
constexpr absl::Duration kMaxTickPeriod = absl::Milliseconds(10);
// A ticker round this late means the coordinator did not run (Coordinator::Resumed).
constexpr absl::Duration kPauseGap = absl::Seconds(2);
// How often freed memory is handed back to the system (malloc_trim).
constexpr absl::Duration kTrimPeriod = absl::Seconds(5);

bool IsLoopbackAddress(const std::string& address) {
  std::string host = address;
  if (absl::StartsWith(host, "[")) {
    host = host.substr(
        1, host.find(']') == std::string::npos ? std::string::npos : host.find(']') - 1);
  } else if (const size_t colon = host.rfind(':'); colon != std::string::npos) {
    host = host.substr(0, colon);
  }
  if (absl::EqualsIgnoreCase(host, "localhost")) return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  return inet_pton(AF_INET6, host.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

CoordinatorServer::CoordinatorServer(CoordinatorOptions options, ServerSecurity security)
    : executor_(std::make_unique<SerialExecutor>()),
      reads_(std::make_unique<SerialExecutor>()),
      files_(std::make_unique<SerialExecutor>()),
      coordinator_(std::make_unique<Coordinator>([&] {
        if (options.executor == nullptr) options.executor = executor_.get();
        return std::move(options);
      }())),
      security_(std::move(security)) {}

CoordinatorServer::~CoordinatorServer() { Stop(); }

absl::Status CheckListenSecurity(const ServerSecurity& security, const std::string& address) {
  if (security.tls.enabled()) return CheckServerTlsFiles(security.tls);
  if (IsLoopbackAddress(address)) return absl::OkStatus();
  if (!security.insecure_allow_remote) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing to listen on ", address,
        " without TLS: anyone who reaches it could run any command on every worker. Give "
        "--tls-cert, --tls-key and --tls-ca (scripts/dev-ca.sh makes a first set), or listen on "
        "loopback (--listen 127.0.0.1:50051), or accept the risk with "
        "--insecure-allow-remote"));
  }
  if (!security.token_file.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing to take bearer tokens (--token-file) in plaintext on ", address,
        ": they would cross the network in the clear. Give --tls-cert, --tls-key and --tls-ca"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> CoordinatorServer::Start(const std::string& address,
                                             const std::string& unix_path) {
  AuthOptions auth{.required = security_.tls.enabled() || !security_.token_file.empty(),
                   .tokens = nullptr,
                   .admin_group = security_.admin_group,
                   .worker_group = security_.worker_group};
  if (absl::Status s = CheckListenSecurity(security_, address); !s.ok()) return s;
  if (!security_.tls.enabled() && !IsLoopbackAddress(address)) insecure_remote_address_ = address;
  if (!security_.token_file.empty()) {
    absl::StatusOr<std::unique_ptr<TokenFile>> tokens = TokenFile::Open(security_.token_file);
    if (!tokens.ok()) return tokens.status();
    auth.tokens = *std::move(tokens);
  }
  authenticator_ = std::make_unique<Authenticator>(std::move(auth));
  job_service_ =
      std::make_unique<JobService>(*coordinator_, reads_.get(), authenticator_.get(), files_.get());
  worker_service_ = std::make_unique<WorkerService>(*coordinator_, authenticator_.get());
  if (security_.tls.enabled()) trust_ = std::make_unique<CertificateTrust>(security_.tls.ca);
  rendezvous_service_ =
      std::make_unique<RendezvousService>(*coordinator_, authenticator_.get(), files_.get());
  cluster_service_ = std::make_unique<ClusterService>(*coordinator_, authenticator_.get());

  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address, MakeServerCredentials(security_.tls), &port);
  // Daemons on this machine reach it through the socket with fewer system calls and wake-ups than
  // through TCP on loopback (a gRPC round trip 45-55 us against 65-80 us on the development VM).
  if (!unix_path.empty()) {
    builder.AddListeningPort(absl::StrCat("unix:", unix_path),
                             MakeServerCredentials(security_.tls));
  }
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
  unknown_methods_ = std::make_unique<UnknownMethods>();
  builder.RegisterCallbackGenericService(unknown_methods_.get());
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<MalformedRequestsFactory>());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  builder.SetMaxReceiveMessageSize(64 << 20);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port == 0) {
    server_.reset();
    if (port != 0 && !unix_path.empty()) {
      return absl::UnavailableError(absl::StrCat("cannot listen on the Unix socket ", unix_path,
                                                 " (--listen-unix): its directory must exist and "
                                                 "be writable"));
    }
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
  absl::Time warned = absl::InfinitePast();
  absl::Time last_round = absl::Now();
  absl::Time last_trim = absl::Now();
  absl::Time last_token_check = absl::Now();
  absl::Time last_trust_check = absl::Now();
  while (!stopping_.load(std::memory_order_acquire)) {
    // A round starts every few milliseconds (the wait below is bounded by kMaxTickPeriod): a gap
    // of seconds between two starts is the process not running.
    const absl::Time now = absl::Now();
    if (now - last_round > kPauseGap) coordinator_->Resumed(now - last_round);
    last_round = now;
    if (now - last_token_check >= absl::Seconds(1)) {
      last_token_check = now;
      job_service_->EndStreamsOfRevokedTokens();
      // A CA that left the bundle (checked when it changes) or a certificate that expired (every
      // minute) ends the worker sessions it admitted.
      if (trust_ != nullptr && (trust_->Refresh() || now - last_trust_check >= absl::Minutes(1))) {
        last_trust_check = now;
        if (const int ended = worker_service_->EndUntrustedSessions(*trust_); ended > 0) {
          spdlog::warn("ended {} worker sessions whose certificates are no longer trusted", ended);
        }
        job_service_->EndStreamsOfUntrustedCertificates(*trust_);
      }
    }
#ifdef __GLIBC__
    // Memory the jobs that ended (a flood of registrations cancelled) gave back goes back to the
    // system, not only to the allocator's free lists.
    if (now - last_trim >= kTrimPeriod) {
      last_trim = now;
      malloc_trim(0);
    }
#endif
    if (!insecure_remote_address_.empty() && absl::Now() - warned >= absl::Minutes(1)) {
      warned = absl::Now();
      spdlog::warn(
          "serving plaintext without authentication on {} (--insecure-allow-remote): anyone who "
          "reaches it may run any command on every worker; see docs/security.md",
          insecure_remote_address_);
    }
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
  files_->Shutdown();
  executor_->Shutdown();
}

absl::StatusOr<std::unique_ptr<FollowerServer>> FollowerServer::Start(
    const std::string& address, const ServerSecurity& security, std::function<std::string()> leader,
    const std::string& metrics_address) {
  if (absl::Status s = CheckListenSecurity(security, address); !s.ok()) return s;
  std::unique_ptr<FollowerServer> f(new FollowerServer());
  f->refusals_ = std::make_unique<Refusals>(leader);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, MakeServerCredentials(security.tls), &f->port_);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterCallbackGenericService(f->refusals_.get());
  f->server_ = builder.BuildAndStart();
  if (f->server_ == nullptr || f->port_ == 0) {
    const std::string why = BindError(address);
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address, ": ",
                                               why.empty() ? "gRPC could not bind it" : why));
  }
  f->metrics_
      .GetGauge("ringmaster_coordinator_leader",
                "1 while this coordinator replica leads (serves), 0 while it follows.", {})
      .Set(0);
  if (!metrics_address.empty()) {
    absl::StatusOr<std::unique_ptr<MetricsServer>> m = MetricsServer::Start(
        metrics_address, &f->metrics_,
        HealthChecks{.live = [] { return absl::OkStatus(); },
                     .ready =
                         [leader] {
                           const std::string at = leader();
                           return absl::UnavailableError(
                               at.empty() ? std::string("a follower; no leader elected yet")
                                          : absl::StrCat("a follower; the leader is at ", at));
                         }});
    if (!m.ok()) return m.status();
    f->metrics_server_ = *std::move(m);
  }
  return f;
}

int FollowerServer::metrics_port() const {
  return metrics_server_ == nullptr ? 0 : metrics_server_->port();
}

FollowerServer::~FollowerServer() { Stop(); }

void FollowerServer::Stop() {
  metrics_server_.reset();
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    server_->Wait();
    server_.reset();
  }
}

}  // namespace ringmaster
