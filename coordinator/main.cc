// ringmaster-coordinator: the control plane. Registers jobs and workers, places ranks, negotiates
// every cycle, and serves rendezvous. Stops gracefully on SIGTERM or SIGINT.
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/flags.h"
#include "common/logging.h"
#include "coordinator/artifact_store.h"
#include "coordinator/etcd_client.h"
#include "coordinator/etcd_job_store.h"
#include "coordinator/leader_election.h"
#include "coordinator/server.h"
#include "coordinator/sqlite_job_store.h"
#include "coordinator/state_dir.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "address to serve gRPC on (host:port); an address other than loopback needs TLS "
          "(--tls-cert, --tls-key, --tls-ca) or --insecure-allow-remote");
ABSL_FLAG(std::string, listen_unix, "",
          "also serve on a Unix socket at this path, for daemons on this machine (--coordinator "
          "unix:PATH): a round trip costs less than over loopback TCP (empty: off; not with "
          "--store etcd://)");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate of the coordinator, e.g. a Kubernetes TLS secret's tls.crt (env "
          "RINGMASTER_TLS_CERT); reloaded when it changes");
ABSL_FLAG(std::string, tls_key, "",
          "PEM private key of --tls-cert, e.g. tls.key (env RINGMASTER_TLS_KEY)");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle that client certificates must chain to, e.g. ca.crt (env "
          "RINGMASTER_TLS_CA)");
ABSL_FLAG(std::string, token_file, "",
          "users' bearer tokens, in Kubernetes' static token file format: token,user,uid,"
          "\"group1,group2\" per line; reloaded when it changes");
ABSL_FLAG(std::string, admin_group, "ringmaster:admins",
          "members of this group (a certificate's O, a token's group) may act on every job");
ABSL_FLAG(std::string, worker_group, "ringmaster:workers",
          "members of this group may register worker daemons (and may not submit jobs)");
ABSL_FLAG(bool, insecure, false,
          "plaintext without authentication, ignoring RINGMASTER_TLS_*: only on a loopback "
          "--listen address");
ABSL_FLAG(bool, insecure_allow_remote, false,
          "allow plaintext without authentication on an address other than loopback (anyone who "
          "reaches it may run commands on every worker); warned about every minute");
ABSL_FLAG(std::string, log_level, "info",
          "trace, debug, info, warning, error, fatal or off (env HOROVOD_LOG_LEVEL); info logs "
          "jobs and workers coming and going");
ABSL_FLAG(std::string, metrics_listen, "",
          "serve Prometheus metrics at http://ADDR:PORT/metrics (empty: off; port 0 picks one)");
ABSL_FLAG(double, lease_seconds, 10, "a worker without a heartbeat for this long is lost");
ABSL_FLAG(double, heartbeat_interval_seconds, 2, "how often workers are told to heartbeat");
ABSL_FLAG(absl::Duration, start_timeout, absl::Minutes(5),
          "a job whose ranks have not all started this long after it was placed fails, naming "
          "them (e.g. 30s, 5m)");
ABSL_FLAG(std::string, store, "",
          "where jobs are kept: etcd://HOST:PORT[,HOST:PORT...] (etcd's v3 API; keys under "
          "/ringmaster/jobs/); empty: --state-dir's SQLite database, or memory without it");
ABSL_FLAG(std::string, advertise_address, "",
          "with --store etcd://: the address (HOST:PORT) clients reach this replica at, which "
          "followers name to them while it leads; unique per replica (empty: --listen's, with the "
          "machine's host name for a wildcard host)");
ABSL_FLAG(absl::Duration, leader_ttl, absl::Seconds(5),
          "with --store etcd://: the TTL of the leader's etcd lease; a follower takes over this "
          "long after the leader died at most (plus about 0.2 s)");
ABSL_FLAG(absl::Duration, resume_timeout, absl::Minutes(1),
          "after a restart with --state-dir, how long a job that was running waits for its ranks' "
          "daemons to reattach; a rank not back by then fails the job, named");
ABSL_FLAG(
    std::string, artifacts_dir, "",
    "where jobs' timelines and autotune logs are kept, as DIR/JOB_ID/NAME (empty: "
    "$TMPDIR/ringmaster-artifacts-UID/HOST-PORT of --listen, or .../pid-PID for port 0; TMPDIR "
    "defaulting to /tmp)");

ABSL_FLAG(absl::Duration, job_retention, absl::Hours(24 * 7),
          "an ended job is kept (with its logs and artifacts) this long after it ended, e.g. 24h");
ABSL_FLAG(int64_t, max_active_jobs, 1000,
          "at most this many jobs that have not ended are taken; more are refused "
          "(RESOURCE_EXHAUSTED)");
ABSL_FLAG(int64_t, max_active_jobs_per_user, 100,
          "at most this many jobs that have not ended per user (their owner); more of that user's "
          "are refused (RESOURCE_EXHAUSTED), others' still taken; 0: no per-user bound");
ABSL_FLAG(int64_t, max_registrations_per_minute, 600,
          "at most this many jobs registered per user in any minute; more are refused "
          "(RESOURCE_EXHAUSTED saying when to retry); 0: no bound");
ABSL_FLAG(int64_t, max_ended_jobs, 10000,
          "at most this many ended jobs are kept; the oldest go first");
ABSL_FLAG(int64_t, max_source_bytes, int64_t{64} << 20,
          "the largest code archive (tar.gz) a job may carry (SubmitJob, `ringmaster submit "
          "--source-dir`, the Python Estimator's source_dir); larger ones are refused "
          "(INVALID_ARGUMENT naming this limit)");
ABSL_FLAG(int64_t, max_output_bytes, int64_t{1} << 30,
          "the most a rank may leave in its output directory (RINGMASTER_OUTPUT_DIR), in bytes; "
          "past it the rest is not kept");
ABSL_FLAG(std::string, state_dir, "",
          "keep jobs (specs, states, reasons, events, assignments) in a SQLite database in this "
          "directory, so they survive a restart (artifacts default to DIR/artifacts); empty: in "
          "memory");

namespace {

volatile std::sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

// `address` with its port replaced by `port`.
std::string WithPort(const std::string& address, int port) {
  const size_t colon = address.rfind(':');
  return absl::StrCat(colon == std::string::npos ? address : address.substr(0, colon), ":", port);
}

// Where clients reach this replica: --advertise-address, else --listen's host (the machine's name
// for a wildcard one) and the port it got.
std::string AdvertisedAddress(const std::string& flag, const std::string& listen, int port) {
  if (!flag.empty()) return flag;
  const size_t colon = listen.rfind(':');
  std::string host = colon == std::string::npos ? listen : listen.substr(0, colon);
  if (host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::") {
    char name[256] = {};
    gethostname(name, sizeof(name) - 1);
    host = name;
  }
  return absl::StrCat(host, ":", port);
}

}  // namespace

int main(int argc, char** argv) {
  constexpr char kUsage[] =
      "ringmaster-coordinator [--listen ADDR:PORT] [--listen-unix PATH] [--tls-cert F --tls-key F "
      "--tls-ca F] "
      "[--token-file F] [--insecure | --insecure-allow-remote] [--metrics-listen ADDR:PORT] "
      "[--log-level LEVEL] [--state-dir DIR] [--store etcd://HOST:PORT,...] [--artifacts-dir DIR]";
  ringmaster::HandleHelp(argc, argv, kUsage, "coordinator/main.cc");
  absl::SetProgramUsageMessage(kUsage);
  // Everything the coordinator writes (its job store and WAL, the logs' journal, artifacts, code
  // archives) may hold a job's secrets: private to its user whatever umask it was started with.
  umask(0077);
  // Debian's Abseil is built with mutex deadlock detection on; it costs every lock a graph update,
  // so it is off unless RINGMASTER_MUTEX_DEADLOCK_DETECTION asks for it.
  ringmaster::ConfigureDeadlockDetection();
  ringmaster::KebabFlags flags(argc, argv);
  absl::ParseCommandLine(flags.argc(), flags.argv());
  std::string level = absl::GetFlag(FLAGS_log_level);
  if (const char* env = std::getenv("HOROVOD_LOG_LEVEL"); env != nullptr && level == "info") {
    level = env;
  }
  if (absl::Status s = ringmaster::InitLogging(level); !s.ok()) {
    std::fprintf(stderr, "ringmaster-coordinator: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  const double lease = absl::GetFlag(FLAGS_lease_seconds);
  const double heartbeat = absl::GetFlag(FLAGS_heartbeat_interval_seconds);
  if (!(lease > 0) || !(heartbeat > 0) || heartbeat >= lease) {
    std::fprintf(stderr,
                 "ringmaster-coordinator: need 0 < --heartbeat-interval-seconds < "
                 "--lease-seconds\n");
    return 2;
  }
  ringmaster::CoordinatorOptions options;
  options.lease = absl::Milliseconds(lease * 1000);
  options.heartbeat_interval = absl::Milliseconds(heartbeat * 1000);
  options.start_timeout = absl::GetFlag(FLAGS_start_timeout);
  if (options.start_timeout <= absl::ZeroDuration()) {
    std::fprintf(stderr, "ringmaster-coordinator: --start-timeout must be positive\n");
    return 2;
  }
  options.job_retention = absl::GetFlag(FLAGS_job_retention);
  options.max_ended_jobs = absl::GetFlag(FLAGS_max_ended_jobs);
  options.max_active_jobs = absl::GetFlag(FLAGS_max_active_jobs);
  options.max_active_jobs_per_user = absl::GetFlag(FLAGS_max_active_jobs_per_user);
  options.max_registrations_per_minute = absl::GetFlag(FLAGS_max_registrations_per_minute);
  if (options.max_active_jobs_per_user < 0 || options.max_registrations_per_minute < 0) {
    std::fprintf(stderr,
                 "ringmaster-coordinator: --max-active-jobs-per-user and "
                 "--max-registrations-per-minute must be at least 0\n");
    return 2;
  }
  if (options.job_retention <= absl::ZeroDuration() || options.max_ended_jobs < 1 ||
      options.max_active_jobs < 1) {
    std::fprintf(stderr,
                 "ringmaster-coordinator: --job-retention must be positive, --max-ended-jobs and "
                 "--max-active-jobs at least 1\n");
    return 2;
  }
  options.max_source_bytes = absl::GetFlag(FLAGS_max_source_bytes);
  options.max_output_bytes_per_rank = absl::GetFlag(FLAGS_max_output_bytes);
  if (options.max_source_bytes < 1 || options.max_output_bytes_per_rank < 0) {
    std::fprintf(stderr,
                 "ringmaster-coordinator: --max-source-bytes must be at least 1, "
                 "--max-output-bytes at least 0\n");
    return 2;
  }
  options.resume_timeout = absl::GetFlag(FLAGS_resume_timeout);
  if (options.resume_timeout <= absl::ZeroDuration()) {
    std::fprintf(stderr, "ringmaster-coordinator: --resume-timeout must be positive\n");
    return 2;
  }
  const std::string state_dir = absl::GetFlag(FLAGS_state_dir);
  const std::string store_url = absl::GetFlag(FLAGS_store);
  const absl::Duration leader_ttl = absl::GetFlag(FLAGS_leader_ttl);
  if (!store_url.empty() && !absl::GetFlag(FLAGS_listen_unix).empty()) {
    // Replicas take turns leading on several machines: a socket on one of them reaches one.
    std::fprintf(stderr,
                 "ringmaster-coordinator: --listen-unix serves one coordinator's machine; it does "
                 "not go with --store etcd:// (replicas)\n");
    return 2;
  }
  if (!store_url.empty()) {
    if (leader_ttl < absl::Seconds(1)) {
      std::fprintf(stderr, "ringmaster-coordinator: --leader-ttl must be at least 1s\n");
      return 2;
    }
    // Refused at start, naming the URL, when etcd does not answer. The jobs are read again once
    // this replica leads (they may change meanwhile).
    if (absl::StatusOr<std::unique_ptr<ringmaster::JobStore>> store =
            ringmaster::OpenEtcdJobStore(store_url);
        !store.ok()) {
      std::fprintf(stderr, "ringmaster-coordinator: %s\n",
                   std::string(store.status().message()).c_str());
      return 1;
    }
  }
  if (!state_dir.empty()) {
    // Also when it exists already (systemd's StateDirectory=, a volume): tightened, or refused.
    if (absl::Status s = ringmaster::MakeStateDirPrivate(state_dir); !s.ok()) {
      std::fprintf(stderr, "ringmaster-coordinator: --state-dir %s: %s\n", state_dir.c_str(),
                   std::string(s.message()).c_str());
      return 1;
    }
    if (absl::GetFlag(FLAGS_store).empty()) {  // the jobs in DIR/jobs.db
      absl::StatusOr<std::unique_ptr<ringmaster::JobStore>> store =
          ringmaster::OpenSqliteJobStore(state_dir);
      if (!store.ok()) {
        std::fprintf(stderr, "ringmaster-coordinator: %s\n",
                     std::string(store.status().message()).c_str());
        return 1;
      }
      options.store = *std::move(store);
    }
    absl::StatusOr<std::unique_ptr<ringmaster::LogJournal>> journal =
        ringmaster::LogJournal::Open(state_dir + "/logs");
    if (!journal.ok()) {
      std::fprintf(stderr, "ringmaster-coordinator: --state-dir %s: %s\n", state_dir.c_str(),
                   std::string(journal.status().message()).c_str());
      return 1;
    }
    options.log_journal = *std::move(journal);
  }
  if (std::string dir = absl::GetFlag(FLAGS_artifacts_dir); !dir.empty()) {
    options.artifacts_dir = std::move(dir);
  } else if (!state_dir.empty()) {
    options.artifacts_dir = state_dir + "/artifacts";  // with the jobs they belong to
  } else {
    // Per coordinator: two coordinators on one machine must not share (and wipe) each other's.
    options.artifacts_dir = ringmaster::DefaultArtifactsDir(
        ringmaster::ArtifactsInstanceName(absl::GetFlag(FLAGS_listen)));
  }
  ringmaster::ServerSecurity security;
  const bool insecure = absl::GetFlag(FLAGS_insecure) || absl::GetFlag(FLAGS_insecure_allow_remote);
  if (!insecure) {
    security.tls = ringmaster::TlsFilesFrom(
        absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key), absl::GetFlag(FLAGS_tls_ca));
  } else if (!absl::GetFlag(FLAGS_tls_cert).empty() || !absl::GetFlag(FLAGS_tls_key).empty() ||
             !absl::GetFlag(FLAGS_tls_ca).empty()) {
    std::fprintf(stderr, "ringmaster-coordinator: --insecure and --tls-* exclude each other\n");
    return 2;
  }
  security.token_file = absl::GetFlag(FLAGS_token_file);
  security.admin_group = absl::GetFlag(FLAGS_admin_group);
  security.worker_group = absl::GetFlag(FLAGS_worker_group);
  security.insecure_allow_remote = absl::GetFlag(FLAGS_insecure_allow_remote);
  const bool tls = security.tls.enabled();
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  std::string listen = absl::GetFlag(FLAGS_listen);
  std::string metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  std::unique_ptr<ringmaster::LeaderElection> election;
  // What the follower's calls read: set once the election exists.
  std::atomic<ringmaster::LeaderElection*> electing{nullptr};
  if (!store_url.empty()) {
    // Replicas on one etcd elect a leader; this one serves only once it leads, and meanwhile
    // answers every call naming the leader.
    absl::StatusOr<std::unique_ptr<ringmaster::FollowerServer>> follower =
        ringmaster::FollowerServer::Start(
            listen, security,
            [&electing] {
              ringmaster::LeaderElection* e = electing.load();
              return e == nullptr ? std::string() : e->leader();
            },
            metrics_listen);
    if (!follower.ok()) {
      std::fprintf(stderr, "ringmaster-coordinator: %s\n",
                   std::string(follower.status().message()).c_str());
      return 1;
    }
    // The same ports once leading (port 0 picked them now).
    listen = WithPort(listen, (*follower)->port());
    const std::string advertised =
        AdvertisedAddress(absl::GetFlag(FLAGS_advertise_address), listen, (*follower)->port());
    election = std::make_unique<ringmaster::LeaderElection>(
        std::make_unique<ringmaster::EtcdClient>(*ringmaster::ParseEtcdUrl(store_url),
                                                 absl::Seconds(2)),
        ringmaster::LeaderElectionOptions{.identity = advertised, .ttl = leader_ttl});
    electing.store(election.get());
    election->Start();
    // A replica that wins at once (the only one, or a restart of the leader) says nothing as a
    // follower.
    if (!election
             ->AwaitLeadership([start = absl::Now()] {
               return g_stop || absl::Now() - start > absl::Milliseconds(500);
             })
             .ok()) {
      std::printf("ringmaster-coordinator listening on port %d as a follower\n",
                  (*follower)->port());
      std::fflush(stdout);
      spdlog::info("{} follows (the leader is at {}); it serves once it leads", advertised,
                   election->leader());
      if (!election->AwaitLeadership([] { return g_stop != 0; }).ok()) {
        spdlog::info("stopped while following");
        return 0;
      }
    }
    spdlog::info("{} leads: serving", advertised);
    (*follower)->Stop();
    if (const int metrics_port = (*follower)->metrics_port(); metrics_port != 0) {
      metrics_listen = WithPort(metrics_listen, metrics_port);
    }
    absl::StatusOr<std::unique_ptr<ringmaster::JobStore>> store =
        ringmaster::OpenEtcdJobStore(store_url, "/ringmaster", absl::Seconds(5),
                                     ringmaster::EtcdFence{election->key(), election->revision()});
    if (!store.ok()) {
      std::fprintf(stderr, "ringmaster-coordinator: %s\n",
                   std::string(store.status().message()).c_str());
      election->Resign();
      return 1;
    }
    options.store = *std::move(store);
  }
  ringmaster::CoordinatorServer server(std::move(options), std::move(security));
  absl::StatusOr<int> port = server.Start(listen, absl::GetFlag(FLAGS_listen_unix));
  if (!port.ok()) {
    std::fprintf(stderr, "ringmaster-coordinator: %s\n",
                 std::string(port.status().message()).c_str());
    return 1;
  }
  // Printed on stdout so scripts that asked for port 0 learn the port.
  std::printf("ringmaster-coordinator listening on port %d\n", *port);
  if (!metrics_listen.empty()) {
    absl::StatusOr<int> metrics_port = server.StartMetrics(metrics_listen);
    if (!metrics_port.ok()) {
      std::fprintf(stderr, "ringmaster-coordinator: %s\n",
                   std::string(metrics_port.status().message()).c_str());
      return 1;
    }
    std::printf("ringmaster-coordinator metrics on port %d\n", *metrics_port);
  }
  std::fflush(stdout);
  spdlog::info("listening on {} (port {}, {}); jobs {}; artifacts in {}", listen, *port,
               tls ? "mutual TLS" : "plaintext",
               !store_url.empty()  ? absl::StrCat("in ", store_url)
               : state_dir.empty() ? std::string("in memory (no --state-dir)")
                                   : absl::StrCat("in ", state_dir, "/jobs.db"),
               server.coordinator().artifacts_dir());
  if (election != nullptr) {
    server.coordinator()
        .metrics()
        .GetGauge("ringmaster_coordinator_leader",
                  "1 while this coordinator replica leads (serves), 0 while it follows.", {})
        .Set(1);
  }
  std::string lost;
  while (!g_stop && (election == nullptr || (lost = election->lost()).empty())) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  if (!lost.empty()) {
    // Another replica leads now, or may at any moment: stop serving at once. The daemons keep
    // their ranks and reattach to the new leader. A supervisor (systemd, Kubernetes) restarts this
    // process, which then follows.
    spdlog::error("no longer the leader ({}); stopping", lost);
    server.Stop(absl::Milliseconds(200));
    return 1;
  }
  spdlog::info("shutting down");
  server.Stop();
  // Its successor need not wait out the lease.
  if (election != nullptr) election->Resign();
  return 0;
}
