// ringmaster-worker: the per-GPU (or per-CPU-slot) daemon. Registers with the coordinator, serves
// one job rank at a time, and stays up between jobs. Stops on SIGTERM or SIGINT (its rank's
// process, if any, gets SIGTERM and then SIGKILL after the grace period).
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/flags.h"
#include "common/logging.h"
#include "worker/daemon.h"

ABSL_FLAG(std::string, coordinator, "",
          "coordinator address host:port, or its replicas' host:port,host:port,... (the leader is "
          "followed), or unix:PATH for one on this machine serving --listen-unix PATH (env "
          "RINGMASTER_COORDINATOR)");
ABSL_FLAG(
    std::string, device, "cpu",
    "the slot this daemon serves: cpu or cuda:N (also cpuN and cudaN, systemd instance names)");
ABSL_FLAG(std::string, host_name, "", "host name reported to the coordinator (default: hostname)");
ABSL_FLAG(std::string, socket, "",
          "Unix socket of the local API (default /tmp/ringmaster-worker-PID.sock); refused when "
          "another worker answers there");
ABSL_FLAG(
    std::string, iface, "",
    "network interface of the data plane, Gloo and NCCL's bootstrap (env HOROVOD_GLOO_IFACE); "
    "default: the one holding the address of the route to the coordinator (NCCL_SOCKET_IFNAME, "
    "when set, still chooses NCCL's)");
ABSL_FLAG(std::string, metrics_listen, "",
          "serve Prometheus metrics at http://ADDR:PORT/metrics (empty: off; port 0 picks one)");
ABSL_FLAG(int64_t, arena_mb, 1024, "shared-memory arena per job, MiB");
ABSL_FLAG(std::string, work_dir, "",
          "directory under which each launched rank gets its own (its unpacked code and its "
          "output directory, RINGMASTER_OUTPUT_DIR), removed when the rank is done (default: "
          "$TMPDIR/ringmaster-ranks-<uid>)");
ABSL_FLAG(double, collective_timeout_seconds, 30, "bound on the rendezvous and every collective");
ABSL_FLAG(absl::Duration, coordinator_grace, absl::Minutes(5),
          "stop the rank being served once the coordinator has been unreachable this long (e.g. "
          "30s, 5m); until then the rank keeps running and the worker keeps reconnecting");
ABSL_FLAG(std::string, log_level, "warning", "trace, debug, info, warning, error, fatal, off");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate of this worker (O=ringmaster:workers), e.g. a Kubernetes TLS secret's "
          "tls.crt (env RINGMASTER_TLS_CERT); reloaded when it changes");
ABSL_FLAG(std::string, tls_key, "",
          "PEM private key of --tls-cert, e.g. tls.key (env RINGMASTER_TLS_KEY)");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle the coordinator's certificate must chain to, e.g. ca.crt (env "
          "RINGMASTER_TLS_CA)");
ABSL_FLAG(bool, insecure, false, "plaintext to the coordinator, ignoring RINGMASTER_TLS_*");
ABSL_FLAG(std::string, socket_group, "",
          "group of the --socket file, a name or a gid (mode 0660; default: the daemon's group): "
          "its members may connect, and only processes of the daemon's own user, root and "
          "--attach-uid are welcomed");
ABSL_FLAG(std::string, attach_uid, "",
          "comma-separated uids whose processes may attach besides the daemon's own user and root "
          "(e.g. 10001: Kubernetes training pods' runAsUser; they also need --socket-group)");

namespace {

volatile std::sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

// The daemon's options from its flags (and environment): INVALID_ARGUMENT naming the flag.
absl::StatusOr<ringmaster::DaemonOptions> OptionsFromFlags() {
  ringmaster::DaemonOptions options;
  options.coordinator = absl::GetFlag(FLAGS_coordinator);
  if (options.coordinator.empty()) options.coordinator = Env("RINGMASTER_COORDINATOR");
  if (options.coordinator.empty()) {
    return absl::InvalidArgumentError("--coordinator (or RINGMASTER_COORDINATOR) is required");
  }
  options.device = absl::GetFlag(FLAGS_device);
  // The systemd instance form (ringmaster-worker@cuda0, @cpu, @cpu3): cudaN is cuda:N, cpuN a CPU
  // slot (N tells the instances of one host apart).
  if (int n = 0; absl::StartsWith(options.device, "cuda") && options.device.size() > 4 &&
                 options.device[4] != ':' && absl::SimpleAtoi(options.device.substr(4), &n)) {
    options.device = absl::StrCat("cuda:", options.device.substr(4));
  } else if (absl::StartsWith(options.device, "cpu") && options.device.size() > 3 &&
             absl::SimpleAtoi(options.device.substr(3), &n) && n >= 0) {
    options.device = "cpu";
  }
  options.host_name = absl::GetFlag(FLAGS_host_name);
  options.socket_path = absl::GetFlag(FLAGS_socket);
  options.work_dir = absl::GetFlag(FLAGS_work_dir);
  options.socket_group = absl::GetFlag(FLAGS_socket_group);
  for (absl::string_view uid :
       absl::StrSplit(absl::GetFlag(FLAGS_attach_uid), ',', absl::SkipEmpty())) {
    uint32_t n = 0;
    if (!absl::SimpleAtoi(uid, &n)) {
      return absl::InvalidArgumentError(absl::StrCat("--attach-uid '", uid, "' is not a uid"));
    }
    options.attach_uids.push_back(static_cast<uid_t>(n));
  }
  options.iface = absl::GetFlag(FLAGS_iface);
  if (options.iface.empty()) options.iface = Env("HOROVOD_GLOO_IFACE");
  const int64_t arena_mb = absl::GetFlag(FLAGS_arena_mb);
  if (arena_mb < 16 || arena_mb > (int64_t{1} << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--arena-mb ", arena_mb, " is out of bounds [16, 1048576]"));
  }
  options.arena_bytes = static_cast<size_t>(arena_mb) << 20;
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  // A benchmarking aid: RINGMASTER_WORKER_METRICS=off makes the engine record nothing, so the cost
  // of metrics can be measured (bench/metrics_cost.sh).
  options.record_metrics = Env("RINGMASTER_WORKER_METRICS") != "off";
  options.collective_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_collective_timeout_seconds) * 1000);
  options.coordinator_grace = absl::GetFlag(FLAGS_coordinator_grace);
  if (options.coordinator_grace <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--coordinator-grace must be positive");
  }
  if (!absl::GetFlag(FLAGS_insecure)) {
    options.tls = ringmaster::TlsFilesFrom(
        absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key), absl::GetFlag(FLAGS_tls_ca));
    if (options.tls.enabled()) {
      // A worker proves who it is by its certificate: it needs one (tokens are for users).
      if (absl::Status s = ringmaster::CheckServerTlsFiles(options.tls); !s.ok()) return s;
    }
  }

  return options;
}

}  // namespace

int main(int argc, char** argv) {
  constexpr char kUsage[] =
      "ringmaster-worker --coordinator ADDR:PORT [--device cpu|cuda:N] [--host-name NAME] "
      "[--socket PATH] [--iface IFACE] [--metrics-listen ADDR:PORT] "
      "[--tls-cert F --tls-key F --tls-ca F | --insecure]";
  ringmaster::HandleHelp(argc, argv, kUsage, "worker/main.cc");
  absl::SetProgramUsageMessage(kUsage);
  // Debian's Abseil is built with mutex deadlock detection on; it costs every lock a graph update,
  // so it is off unless RINGMASTER_MUTEX_DEADLOCK_DETECTION asks for it.
  ringmaster::ConfigureDeadlockDetection();
  ringmaster::KebabFlags flags(argc, argv);
  absl::ParseCommandLine(flags.argc(), flags.argv());
  std::string level = absl::GetFlag(FLAGS_log_level);
  if (level == "warning" && !Env("HOROVOD_LOG_LEVEL").empty()) level = Env("HOROVOD_LOG_LEVEL");
  if (absl::Status s = ringmaster::InitLogging(level); !s.ok()) {
    std::fprintf(stderr, "ringmaster-worker: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  absl::StatusOr<ringmaster::DaemonOptions> options = OptionsFromFlags();
  if (!options.ok()) {
    std::fprintf(stderr, "ringmaster-worker: %s\n",
                 std::string(options.status().message()).c_str());
    return 2;
  }

  ringmaster::Daemon daemon(*std::move(options));
  if (absl::Status s = daemon.Start(); !s.ok()) {
    std::fprintf(stderr, "ringmaster-worker: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  if (daemon.metrics_port() != 0) {
    std::printf("ringmaster-worker metrics on port %d\n", daemon.metrics_port());
    std::fflush(stdout);
  }
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  std::thread watcher([&daemon] {
    while (!g_stop) absl::SleepFor(absl::Milliseconds(50));
    daemon.Shutdown();
  });
  daemon.Run();
  g_stop = 1;
  watcher.join();
  return 0;
}
