// Simulated ranks for the negotiation benchmark that cost the benchmark machine little: every rank
// holds a real Session stream (RegisterWorker, the Session protocol, request batches by cache id
// once cached), but all of them are driven through gRPC's callback client API by gRPC's own few
// threads, instead of two threads per rank (SimWorker). On a small machine that shares its cores
// with the coordinator under test, thread-per-rank clients spend more CPU on context switches than
// the coordinator spends negotiating; real ranks run on other machines.
//
// Not a general client: no collectives, no resends (the cache never evicts at these sizes), one
// job.
//
// With `relay`, the first rank registered on each simulated host relays its host's batches
// (RelayedBatches: one message per host and step, the cache ids that all of them hold sent once)
// and receives one RelayedResponses per host and cycle, which it hands to its host's ranks, as a
// worker daemon relaying for its host does.
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "ringmaster/v1/worker.grpc.pb.h"

namespace ringmaster {

class CallbackRanks {
 public:
  // Registers `ranks` workers (host names sim-0, sim-1, ... of `per_host` each) and opens their
  // sessions. With `relay`, the ranks negotiate through relays as the job's plan has them
  // (common/relay_plan.h), a relay for every `relay_hosts` hosts: the job must be registered with
  // the same negotiation_relay_hosts.
  static absl::StatusOr<std::unique_ptr<CallbackRanks>> Connect(
      std::shared_ptr<grpc::Channel> channel, int ranks, int per_host, absl::Duration timeout,
      bool relay = false, int relay_hosts = 1);
  ~CallbackRanks();

  // Waits for every worker's assignment (after a job of `ranks` ranks was registered) and reports
  // each rank STARTED.
  absl::Status WaitAssignments(absl::Duration timeout);

  // One step: every rank submits `tensors` in one batch (by cache id when cached) and the call
  // returns once every rank has received an answer for every tensor. `last_sent` (optional): when
  // the step's last message was handed to gRPC.
  absl::Status Step(const std::vector<v1::TensorRequest>& tensors, absl::Duration timeout,
                    absl::Time* last_sent = nullptr);

  // Reports every rank EXITED and ends the sessions.
  void Close();

 private:
  class Rank;
  CallbackRanks() = default;
  std::vector<std::unique_ptr<Rank>> ranks_;
  // Every rank heartbeats at the coordinator's interval, as a worker daemon does (in relay mode
  // the relayed ranks send nothing else, and would be lost at their lease's end).
  std::thread heartbeats_;
  absl::Notification stop_heartbeats_;
  absl::Duration heartbeat_interval_ = absl::Seconds(2);
  bool relay_ = false;
  int per_host_ = 1;
  int relay_hosts_ = 1;
  // With relay_: each relay's group of job ranks, the relay first (set by WaitAssignments).
  std::vector<std::vector<int>> groups_;
  std::vector<int> direct_;  // ranks alone in their groups
  // By job rank, once assigned (the relays hand lists to these).
  std::vector<Rank*> by_rank_;
};

}  // namespace ringmaster
