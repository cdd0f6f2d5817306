// A worker's link to the coordinator: registration, the one Session stream, heartbeats, and
// reconnection with exponential backoff (100 ms doubling to 5 s; to 500 ms when several replicas'
// addresses are given, so a new leader is found quickly). A session that the coordinator ends with
// NOT_FOUND or FAILED_PRECONDITION (lease expired) makes the worker register again. A follower
// replica's refusal (UNAVAILABLE naming the leader) sends it to the leader.
//
// A write that the coordinator does not take within the write timeout (it stopped reading: hung, or
// its host unreachable while TCP keeps retrying) cancels the session, which then reconnects: Send()
// never blocks for longer than that.
//
// Thread-safe. One thread runs the connection; the listener is called from it and must not block.
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/coordinator_channels.h"
#include "grpcpp/grpcpp.h"
#include "ringmaster/v1/worker.grpc.pb.h"

namespace ringmaster {

class CoordinatorSession {
 public:
  class Listener {
   public:
    virtual ~Listener() = default;
    virtual void OnMessage(const v1::CoordinatorMessage& message) = 0;
    // The session ended; `reregistered` when the worker id changed (the old one is gone for good).
    virtual void OnSessionLost(const absl::Status& status, bool reregistered) = 0;
    // A session is about to open: what the worker has of the ranks it serves goes in `open`.
    virtual void OnSessionOpen(v1::SessionOpen* /*open*/) {}
  };

  // `listener` is borrowed and must outlive Stop().
  CoordinatorSession(std::shared_ptr<CoordinatorChannels> channels,
                     v1::RegisterWorkerRequest registration, Listener* listener,
                     absl::Duration write_timeout = absl::Seconds(10));
  ~CoordinatorSession();

  void Start();
  // Ends the session and joins its threads.
  void Stop();

  // UNAVAILABLE while not connected, or when the write timed out (the session is then cancelled).
  // Messages are written one at a time, in the order of the calls.
  //
  // Fault injection, for tests: with RINGMASTER_FAULT_DROP_SESSION=N in the environment, every
  // N-th message is dropped as if lost in flight (Send still says OK) and the session is cut, so
  // it reconnects and resumes.
  absl::Status Send(const v1::WorkerMessage& message);
  std::string worker_id() const;
  bool connected() const;
  // Ends the current session as a broken connection would: the worker reconnects at once and
  // resumes its ranks (a negotiation relay's link that broke, for one).
  void Interrupt();

 private:
  void Run();
  // Waits up to `d` for the channel to connect (returning as soon as it does: a coordinator back
  // after a restart is reached at once, not after the rest of the backoff), or until Stop().
  void AwaitCoordinator(absl::Duration d);
  // One session: open, read until it ends. Returns the final status; `accepted` says whether the
  // coordinator took it (answered the open).
  grpc::Status RunSession(bool* accepted);

  const std::shared_ptr<CoordinatorChannels> channels_;
  // This daemon process's incarnation (random, never 0): its registration and sessions carry it.
  const uint64_t incarnation_;
  const v1::RegisterWorkerRequest registration_;
  Listener* const listener_;
  const absl::Duration write_timeout_;
  std::thread thread_;
  std::thread heartbeat_;
  std::thread watchdog_;
  std::atomic<bool> stopping_{false};
  // When the write in progress started (steady clock, ns), 0 when none: the watchdog's input.
  std::atomic<int64_t> write_started_ns_{0};
  // RINGMASTER_FAULT_DROP_SESSION (0: off) and the messages sent so far (under write_mu_).
  const int64_t drop_every_;
  int64_t sent_ ABSL_GUARDED_BY(write_mu_) = 0;
  // The rank updates (STARTED, EXITED) of the latest job reported, written again after every
  // reconnect: one lost with a broken session would leave its job STARTING or RUNNING for ever.
  // The coordinator takes a repeated one as a no-op.
  std::vector<v1::WorkerMessage> rank_updates_ ABSL_GUARDED_BY(write_mu_);
  // The latest job's last output messages (at most kKeptOutputBytes), written again after a
  // reconnect before the rank updates; the coordinator drops those it stored (by RankOutput.seq).
  static constexpr size_t kKeptOutputBytes = size_t{1} << 20;
  std::deque<v1::WorkerMessage> outputs_ ABSL_GUARDED_BY(write_mu_);
  size_t output_bytes_ ABSL_GUARDED_BY(write_mu_) = 0;

  // Held for a whole write (writes go one at a time); the stream is not destroyed while it is held.
  absl::Mutex write_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  std::string session_secret_ ABSL_GUARDED_BY(mu_);  // issued with worker_id_
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_) = absl::Seconds(2);
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>* stream_
      ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace ringmaster
