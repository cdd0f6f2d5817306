// What a rank's collectives spend their time on, for the coordinator's "who is slow"
// (docs/operations.md, "Finding a slow rank"): the time executing them, the part of it inside
// network communicators, and what the kernel says of the data plane's TCP connections (bytes the
// peers acknowledged, time with data in flight: TCP_INFO). A rank late to submit is told by the
// coordinator from its requests; a slow link from these: every rank's collectives slow, and one
// host's connections sending at a fraction of the others' rate.
//
// The engine adds each executed response (Executed); a TimedBackend adds its communicator's calls;
// the connections are the TCP sockets that appeared while a communicator connected (TcpSockets()
// before, Adopt() after). ExecutionReporter sends the totals to the coordinator about once a
// second.
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "worker/backend.h"

namespace ringmaster {

class ExecutionClocks {
 public:
  // At most this many connections are read (a flat communicator of 1,024 ranks has 1,023 per
  // communicator); more are not adopted.
  static constexpr size_t kMaxConnections = 4096;
  // A connection's delivery rate is read when it sent this many bytes since the last Read.
  static constexpr uint64_t kRateBytes = uint64_t{64} << 10;

  ExecutionClocks();

  // A response executed (or failed) in `took`.
  void Executed(absl::Duration took);
  // Network time is the union of the intervals in which some communicator call runs: the parts of
  // a split allreduce, on several threads at once, count once.
  void NetworkEnter();
  void NetworkLeave();

  // The inodes of this process's TCP sockets now. (A socket another part of the process opens
  // while a communicator connects, a relay's or a reconnecting gRPC channel's, is adopted too: its
  // bytes count, but it carries little, and a rate is the highest sample, so its small,
  // application-limited samples do not lower a rank's.)
  using Sockets = absl::flat_hash_set<uint64_t>;
  static Sockets TcpSockets();
  // A communicator connected: the TCP sockets that are not in `before` are its connections, but
  // for those between two addresses of this host (not a link).
  void Adopt(const Sockets& before);

  struct Totals {
    int64_t elapsed_ns = 0;  // since the clocks were made (monotonic)
    int64_t collectives = 0;
    int64_t collective_ns = 0;
    int64_t network_ns = 0;
    int64_t link_bytes_sent = 0;
    int64_t link_busy_ns = 0;
    // The highest delivery-rate sample (bytes per second) of the connections that sent since the
    // last Read (0: none did).
    int64_t link_delivery_rate = 0;
    size_t connections = 0;  // read now
  };
  // Reads the connections (dropping those closed since) and returns the totals. One caller at a
  // time (the reporter).
  Totals Read();

 private:
  struct Connection {
    int fd = -1;
    uint64_t inode = 0;
    uint64_t acked = 0;    // bytes acknowledged, as last read
    uint64_t busy_us = 0;  // time with data in flight, as last read
  };

  // Elapsed and network time are on the monotonic clock: a step of the wall clock changes neither.
  static int64_t SteadyNanos();
  const int64_t start_ns_ = SteadyNanos();
  // Held for a few additions only: Read() makes its system calls without it (the engine's and the
  // communicators' calls never wait on them).
  absl::Mutex mu_;
  int64_t collectives_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t collective_ns_ ABSL_GUARDED_BY(mu_) = 0;
  int active_ ABSL_GUARDED_BY(mu_) = 0;  // communicator calls running
  int64_t entered_ns_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t network_ns_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Connection> connections_ ABSL_GUARDED_BY(mu_);
  int64_t link_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t link_busy_ns_ ABSL_GUARDED_BY(mu_) = 0;
};

// A communicator whose calls count as network time in `clocks`.
class TimedBackend final : public Backend {
 public:
  TimedBackend(std::unique_ptr<Backend> backend, std::shared_ptr<ExecutionClocks> clocks)
      : backend_(std::move(backend)), clocks_(std::move(clocks)) {}

  int rank() const override { return backend_->rank(); }
  int size() const override { return backend_->size(); }
  absl::Status Allreduce(void* data, int64_t count, DataType dtype, ReduceOp op) override;
  absl::Status Broadcast(void* data, int64_t bytes, int root) override;
  absl::Status Allgatherv(const void* in, void* out, absl::Span<const int64_t> bytes) override;
  absl::Status Barrier() override;

 private:
  const std::unique_ptr<Backend> backend_;
  const std::shared_ptr<ExecutionClocks> clocks_;
};

// Sends a rank's totals (`send`) every `interval` while its collectives run: once some collective
// executed since the last send. Also keeps the worker's counters of them (docs/metrics.md,
// "Worker"), labelled `labels`, in `registry` (null: none).
class ExecutionReporter {
 public:
  ExecutionReporter(std::shared_ptr<ExecutionClocks> clocks,
                    std::function<void(const ExecutionClocks::Totals&)> send,
                    absl::Duration interval, MetricsRegistry* registry, const Labels& labels);
  ~ExecutionReporter();  // Stop()s
  ExecutionReporter(const ExecutionReporter&) = delete;
  ExecutionReporter& operator=(const ExecutionReporter&) = delete;

  // Ends the thread (at once, or after a send in progress).
  void Stop();

 private:
  void Loop();
  void Count(const ExecutionClocks::Totals& now);

  const std::shared_ptr<ExecutionClocks> clocks_;
  const std::function<void(const ExecutionClocks::Totals&)> send_;
  const absl::Duration interval_;
  Counter* counters_[4] = {};  // collective, network, link busy seconds; link bytes
  ExecutionClocks::Totals counted_;
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace ringmaster
