#include "worker/execution_clocks.h"

#include <dirent.h>
#include <linux/tcp.h>  // struct tcp_info with tcpi_bytes_acked and tcpi_busy_time (Linux 4.10)
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>

namespace ringmaster {
namespace {

// Calls `f(fd, inode)` for every TCP socket among this process's descriptors.
template <typename F>
void ForEachTcpSocket(F f) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return;
  const int own = dirfd(dir);
  while (dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == own) continue;
    struct stat st;
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    int protocol = 0;
    socklen_t len = sizeof(protocol);
    if (getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_PROTOCOL, &protocol, &len) != 0 ||
        protocol != IPPROTO_TCP) {
      continue;
    }
    f(static_cast<int>(fd), static_cast<uint64_t>(st.st_ino));
  }
  closedir(dir);
}

// The kernel's counts for TCP socket `fd`, if it still is socket `inode`: bytes acknowledged, busy
// time, and its latest delivery-rate sample (bytes per second, as BBR measures it: over the longer
// of the time the sample's packets took to send and to be acknowledged).
bool ReadTcp(int fd, uint64_t inode, uint64_t* acked, uint64_t* busy_us,
             uint64_t* delivery_rate = nullptr) {
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_ino) != inode) return false;
  tcp_info info;
  std::memset(&info, 0, sizeof(info));
  socklen_t len = sizeof(info);
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return false;
  // An older kernel's shorter struct leaves the fields it lacks at zero: no link figures.
  *acked = info.tcpi_bytes_acked;
  *busy_us = info.tcpi_busy_time;
  if (delivery_rate != nullptr) *delivery_rate = info.tcpi_delivery_rate;
  return true;
}

// Whether TCP socket `fd` connects this host to itself (its peer's address is its own): not a link.
bool Loopback(int fd) {
  sockaddr_storage local{}, peer{};
  socklen_t local_len = sizeof(local), peer_len = sizeof(peer);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0 ||
      getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) {
    return true;  // not connected: a listener
  }
  if (local.ss_family != peer.ss_family) return false;
  if (local.ss_family == AF_INET) {
    return reinterpret_cast<sockaddr_in&>(local).sin_addr.s_addr ==
           reinterpret_cast<sockaddr_in&>(peer).sin_addr.s_addr;
  }
  if (local.ss_family == AF_INET6) {
    return std::memcmp(&reinterpret_cast<sockaddr_in6&>(local).sin6_addr,
                       &reinterpret_cast<sockaddr_in6&>(peer).sin6_addr, sizeof(in6_addr)) == 0;
  }
  return false;
}

// Counts the calls it spans as network time.
class NetworkCall {
 public:
  explicit NetworkCall(ExecutionClocks& clocks) : clocks_(clocks) { clocks_.NetworkEnter(); }
  ~NetworkCall() { clocks_.NetworkLeave(); }

 private:
  ExecutionClocks& clocks_;
};

}  // namespace

ExecutionClocks::ExecutionClocks() = default;

int64_t ExecutionClocks::SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void ExecutionClocks::Executed(absl::Duration took) {
  absl::MutexLock lock(&mu_);
  ++collectives_;
  collective_ns_ += absl::ToInt64Nanoseconds(took);
}

void ExecutionClocks::NetworkEnter() {
  const int64_t now = SteadyNanos();
  absl::MutexLock lock(&mu_);
  if (active_++ == 0) entered_ns_ = now;
}

void ExecutionClocks::NetworkLeave() {
  const int64_t now = SteadyNanos();
  absl::MutexLock lock(&mu_);
  if (--active_ == 0) network_ns_ += std::max<int64_t>(0, now - entered_ns_);
}

ExecutionClocks::Sockets ExecutionClocks::TcpSockets() {
  Sockets sockets;
  ForEachTcpSocket([&](int, uint64_t inode) { sockets.insert(inode); });
  return sockets;
}

void ExecutionClocks::Adopt(const Sockets& before) {
  std::vector<Connection> found;
  ForEachTcpSocket([&](int fd, uint64_t inode) {
    if (before.contains(inode) || Loopback(fd)) return;
    Connection c;
    c.fd = fd;
    c.inode = inode;
    // Counted from now: its connection's handshake is not the training's traffic.
    if (ReadTcp(fd, inode, &c.acked, &c.busy_us)) found.push_back(c);
  });
  absl::MutexLock lock(&mu_);
  absl::flat_hash_set<uint64_t> known;
  for (const Connection& k : connections_) known.insert(k.inode);
  for (const Connection& c : found) {
    if (connections_.size() >= kMaxConnections) break;
    if (known.insert(c.inode).second) connections_.push_back(c);
  }
}

ExecutionClocks::Totals ExecutionClocks::Read() {
  // The system calls on a copy, without the lock; the results merged under it. Adopt only
  // appends and only this caller removes, so the copy is still the list's beginning, in order.
  std::vector<Connection> read;
  {
    absl::MutexLock lock(&mu_);
    read = connections_;
  }
  struct Now {
    bool open = false;
    uint64_t acked = 0, busy_us = 0, rate = 0;
  };
  std::vector<Now> now(read.size());
  for (size_t i = 0; i < read.size(); ++i) {
    now[i].open = ReadTcp(read[i].fd, read[i].inode, &now[i].acked, &now[i].busy_us, &now[i].rate);
  }
  const int64_t read_ns = SteadyNanos();
  absl::MutexLock lock(&mu_);
  uint64_t delivery_rate = 0;
  std::vector<Connection> kept;
  kept.reserve(connections_.size());
  for (size_t i = 0; i < read.size(); ++i) {
    Connection* it = &connections_[i];
    if (!now[i].open) continue;  // closed (its communicator is gone)
    if (now[i].acked >= it->acked && now[i].busy_us >= it->busy_us) {
      link_bytes_ += static_cast<int64_t>(now[i].acked - it->acked);
      link_busy_ns_ += static_cast<int64_t>(now[i].busy_us - it->busy_us) * 1000;
    }
    // A connection that sent a fair amount since the last read: its latest rate sample is of now,
    // and of a transfer long enough to say what the path carries.
    if (now[i].acked >= it->acked + kRateBytes)
      delivery_rate = std::max(delivery_rate, now[i].rate);
    it->acked = now[i].acked;
    it->busy_us = now[i].busy_us;
    kept.push_back(*it);
  }
  // And those Adopt added since the copy.
  kept.insert(kept.end(), connections_.begin() + static_cast<ptrdiff_t>(read.size()),
              connections_.end());
  connections_ = std::move(kept);
  Totals t;
  t.elapsed_ns = read_ns - start_ns_;
  t.collectives = collectives_;
  t.collective_ns = collective_ns_;
  // A call in progress counts up to now.
  t.network_ns = network_ns_ + (active_ > 0 ? std::max<int64_t>(0, read_ns - entered_ns_) : 0);
  t.link_bytes_sent = link_bytes_;
  t.link_busy_ns = link_busy_ns_;
  t.link_delivery_rate = static_cast<int64_t>(delivery_rate);
  t.connections = connections_.size();
  return t;
}

absl::Status TimedBackend::Allreduce(void* data, int64_t count, DataType dtype, ReduceOp op) {
  NetworkCall call(*clocks_);
  return backend_->Allreduce(data, count, dtype, op);
}

absl::Status TimedBackend::Broadcast(void* data, int64_t bytes, int root) {
  NetworkCall call(*clocks_);
  return backend_->Broadcast(data, bytes, root);
}

absl::Status TimedBackend::Allgatherv(const void* in, void* out, absl::Span<const int64_t> bytes) {
  NetworkCall call(*clocks_);
  return backend_->Allgatherv(in, out, bytes);
}

absl::Status TimedBackend::Barrier() {
  NetworkCall call(*clocks_);
  return backend_->Barrier();
}

ExecutionReporter::ExecutionReporter(std::shared_ptr<ExecutionClocks> clocks,
                                     std::function<void(const ExecutionClocks::Totals&)> send,
                                     absl::Duration interval, MetricsRegistry* registry,
                                     const Labels& labels)
    : clocks_(std::move(clocks)), send_(std::move(send)), interval_(interval) {
  if (registry != nullptr) {
    counters_[0] = &registry->GetCounter(
        "ringmaster_rank_collective_seconds_total",
        "Time this rank spent executing collectives (from the coordinator's response to the "
        "result in place).",
        labels);
    counters_[1] = &registry->GetCounter(
        "ringmaster_rank_network_seconds_total",
        "Of that, time inside network communicators (the cross-host step of a hierarchical "
        "collective, or a flat one's whole).",
        labels);
    counters_[2] = &registry->GetCounter(
        "ringmaster_rank_link_busy_seconds_total",
        "Time the rank's data-plane TCP connections had data in flight (the kernel's busy time).",
        labels);
    counters_[3] = &registry->GetCounter(
        "ringmaster_rank_link_sent_bytes_total",
        "Bytes the rank's data-plane TCP connections sent and the peers acknowledged.", labels);
  }
  thread_ = std::thread([this] { Loop(); });
}

ExecutionReporter::~ExecutionReporter() { Stop(); }

void ExecutionReporter::Stop() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

void ExecutionReporter::Loop() {
  int64_t sent_collectives = 0;
  while (!stop_.WaitForNotificationWithTimeout(interval_)) {
    const ExecutionClocks::Totals now = clocks_->Read();
    Count(now);
    if (now.collectives == sent_collectives) continue;  // idle: nothing new to say
    sent_collectives = now.collectives;
    send_(now);
  }
}

void ExecutionReporter::Count(const ExecutionClocks::Totals& now) {
  if (counters_[0] == nullptr) return;
  const int64_t ns[3] = {now.collective_ns - counted_.collective_ns,
                         now.network_ns - counted_.network_ns,
                         now.link_busy_ns - counted_.link_busy_ns};
  for (int i = 0; i < 3; ++i) {
    if (ns[i] > 0) counters_[i]->Increment(static_cast<double>(ns[i]) * 1e-9);
  }
  if (now.link_bytes_sent > counted_.link_bytes_sent) {
    counters_[3]->Increment(static_cast<double>(now.link_bytes_sent - counted_.link_bytes_sent));
  }
  counted_ = now;
}

}  // namespace ringmaster
