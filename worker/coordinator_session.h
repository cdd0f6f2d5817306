// A worker's link to the coordinator: registration, the one Session stream, heartbeats, and
// reconnection with exponential backoff (100 ms doubling to 5 s). A session that the coordinator ends
// with NOT_FOUND or FAILED_PRECONDITION (lease expired) makes the worker register again.
//
// Thread-safe. One thread runs the connection; the listener is called from it and must not block.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
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
  };

  // `listener` is borrowed and must outlive Stop().
  CoordinatorSession(std::shared_ptr<grpc::Channel> channel, v1::RegisterWorkerRequest registration,
                     Listener* listener);
  ~CoordinatorSession();

  void Start();
  // Ends the session and joins its threads.
  void Stop();

  // UNAVAILABLE while not connected.
  absl::Status Send(const v1::WorkerMessage& message);
  std::string worker_id() const;
  bool connected() const;

 private:
  void Run();
  // One session: open, read until it ends. Returns the final status.
  grpc::Status RunSession();

  std::unique_ptr<v1::WorkerService::Stub> stub_;
  const v1::RegisterWorkerRequest registration_;
  Listener* const listener_;
  std::thread thread_;
  std::thread heartbeat_;
  std::atomic<bool> stopping_{false};

  mutable absl::Mutex mu_;
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_) = absl::Seconds(2);
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>* stream_
      ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Mutex write_mu_ ABSL_ACQUIRED_AFTER(mu_);
};

}  // namespace ringmaster
