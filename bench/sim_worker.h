// A simulated worker daemon: registers with a real coordinator, holds a real Session stream, and
// negotiates tensors the way a daemon does (full requests the first time, response-cache ids
// after), without executing any collective. Used by the service tests, the negotiation benchmark
// and the demo.
//
// Thread-safe. A reader thread receives coordinator messages; every wait has a deadline.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "ringmaster/v1/worker.grpc.pb.h"
#include "worker/negotiation/worker_cache.h"

namespace ringmaster {

class SimWorker {
 public:
  SimWorker(std::shared_ptr<grpc::Channel> channel, std::string host, std::string device = "cpu");
  ~SimWorker();  // Close()s

  // RegisterWorker, open the session, and wait for the coordinator to accept it.
  absl::Status Connect(absl::Duration timeout = absl::Seconds(10));
  const std::string& worker_id() const { return worker_id_; }
  const std::string& secret() const { return secret_; }  // its session secret

  // The next job assignment.
  absl::StatusOr<v1::JobAssignment> WaitAssignment(absl::Duration timeout);
  // The next StopJob.
  absl::StatusOr<v1::StopJob> WaitStop(absl::Duration timeout);
  // The next response list, raw.
  absl::StatusOr<v1::ResponseList> WaitResponses(absl::Duration timeout);
  // A negotiation relay's lists (RelayedResponses), in order.
  absl::StatusOr<v1::RelayedResponses> WaitRelayed(absl::Duration timeout);

  absl::Status Send(const v1::WorkerMessage& message);
  absl::Status SendRankUpdate(const v1::JobAssignment& a, v1::RankState state, int exit_code,
                              const std::string& message = "");

  // Negotiates `requests` as the rank of assignment `a`: requests by cache id what the coordinator
  // cached, the rest in full, re-sends on request, and waits until every tensor has been answered.
  // Returns the responses in the order received, with cache ids resolved to names when
  // `resolve_names` (the benchmark skips that, as it skips executing the collectives).
  absl::StatusOr<std::vector<v1::Response>> Negotiate(
      const v1::JobAssignment& a, const std::vector<v1::TensorRequest>& requests,
      absl::Duration timeout, bool resolve_names = true);

  // Ends the session (WritesDone) and joins the reader. Returns the stream's final status.
  grpc::Status Close();

 private:
  void ReadLoop();
  template <typename T>
  absl::StatusOr<T> Pop(std::deque<T>& queue, absl::Duration timeout, const char* what);

  const std::string host_;
  const std::string device_;
  std::unique_ptr<v1::WorkerService::Stub> stub_;
  std::string worker_id_;
  std::string secret_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>> stream_;
  std::thread reader_;

  absl::Mutex write_mu_;  // one writer at a time on the stream
  absl::Mutex mu_;
  bool accepted_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::JobAssignment> assignments_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::StopJob> stops_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::ResponseList> responses_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::RelayedResponses> relayed_ ABSL_GUARDED_BY(mu_);

  WorkerCache cache_;          // the response cache, kept as the daemon keeps it
  int64_t cache_version_ = 0;  // bumped on every cache change
  // The last batch sent, reused while the tensors and the cache stay the same.
  v1::WorkerMessage last_batch_;
  const std::vector<v1::TensorRequest>* last_requests_ = nullptr;
  size_t last_size_ = 0;
  int64_t last_cache_version_ = -1;
};

}  // namespace ringmaster
