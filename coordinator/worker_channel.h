// How the coordinator's logic talks to one connected worker. The gRPC session adapter implements
// it; tests implement it with a recording fake. Every method only queues: none may block.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/job.h"
#include "coordinator/negotiation_types.h"

namespace ringmaster {

// One negotiation cycle's output on its way to every rank of a job. Most ranks receive identical
// bytes, so a channel may encode it once and keep the encoding in `encoded` for the other ranks.
struct CycleBroadcast {
  std::string job_id;
  CycleOutput output;
  int64_t fusion_threshold_bytes = 0;
  double cycle_time_ms = 0;
  uint64_t seq = 0;  // the job epoch's cycle number, from 1
  // Every few cycles: the last request batch the coordinator has of each rank (by rank), and the
  // last cycle every rank acknowledged.
  std::vector<uint64_t> request_acks;
  uint64_t all_have = 0;
  // 0 for a job this coordinator started; new after a restart (ResponseList.cache_generation).
  uint64_t cache_generation = 0;

  absl::Mutex mu;
  std::shared_ptr<const void> encoded ABSL_GUARDED_BY(mu);
};

class WorkerChannel {
 public:
  virtual ~WorkerChannel() = default;
  virtual void SendAssignment(const Job& job, int rank) = 0;
  // `cycle->output.notices[rank]` is this worker's own part.
  virtual void SendResponses(const std::shared_ptr<CycleBroadcast>& cycle, int rank) = 0;
  // The same list for ranks `ranks` (in rank order), whose batches this worker relays
  // (RelayedResponses): one message for all of them.
  virtual void SendRelayedResponses(const std::shared_ptr<CycleBroadcast>& cycle,
                                    const std::vector<int>& ranks) = 0;
  virtual void SendStopJob(const std::string& job_id, const std::string& reason) = 0;
  // Elastic jobs: ends epoch `epoch` of the job's rank (its collectives fail) but keeps its process
  // for the next epoch (StopJob.epoch).
  virtual void SendStopEpoch(const std::string& job_id, int64_t epoch, const std::string& reason) {}
  // Elastic jobs: workers were added; the rank's process resets at its next commit.
  virtual void SendHostsUpdated(const std::string& job_id, int64_t epoch) {}
  // The reliable session's answer to a reconnected rank (after the lists re-sent to it): the last
  // request batch the coordinator has of it.
  virtual void SendResumed(const std::string& job_id, int64_t epoch, int rank,
                           uint64_t last_request_seq) = 0;
  virtual void SendShutdown(const std::string& reason) = 0;
  // Ends the session with `status` (e.g. FAILED_PRECONDITION when the lease expired).
  virtual void Close(const absl::Status& status) = 0;
};

}  // namespace ringmaster
