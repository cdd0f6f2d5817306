// The API a training process speaks on the daemon's local socket (LocalServer): a hello admitted
// by the kernel's credentials and answered with the rank's welcome (its arena, topology and, on a
// GPU slot, the device's handles), enqueues handed to the rank's engine, outputs released, ready
// events opened, and the end of a connection. For an attached job (JobSpec.attached) it claims the
// process's rank at the coordinator while the job waits for its ranks.
//
// Thread-safe: called on the local server's connection threads and (ClaimRefused, ClaimsDone) on
// the session's. It holds no job: each call asks `Jobs` for the rank being served.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ringmaster/v1/worker.pb.h"
#include "worker/local/local_server.h"

namespace ringmaster {

class JobRunner;

class LocalApi : public LocalServer::Handler {
 public:
  // The daemon's side: the rank it serves now.
  class Jobs {
   public:
    virtual ~Jobs() = default;
    // The rank being served, once it is built (arena and engine exist); else null.
    virtual std::shared_ptr<JobRunner> ServingJob() = 0;
  };
  struct Options {
    // Users besides the daemon's own and root whose processes may attach.
    std::vector<uid_t> attach_uids;
    // How a claim reaches the coordinator.
    std::function<absl::Status(const v1::WorkerMessage&)> send;
  };

  LocalApi(Options options, Jobs& jobs) : options_(std::move(options)), jobs_(jobs) {}

  // LocalServer::Handler
  absl::StatusOr<Welcome> OnHello(const v1::LocalHello& hello,
                                  const PeerCredentials& peer) override;
  void OnEnqueue(const v1::LocalWelcome* welcome, const v1::LocalEnqueue& enqueue,
                 std::function<void(const v1::LocalCompletion&)> reply) override;
  void OnRelease(const v1::LocalWelcome* welcome, const v1::LocalRelease& release) override;
  absl::Status OnReadyEvents(const v1::LocalReadyEvents& events) override;
  void OnDisconnect(const v1::LocalWelcome* welcome) override;

  // The coordinator refused a claim (kept if it is the one pending).
  void ClaimRefused(const v1::ClaimRefused& refused);
  // A job was assigned: the pending claim is done with.
  void ClaimsDone();

 private:
  // The rank of an attached job that a process waiting at the socket claimed through this
  // daemon, until the job is assigned. One at a time: a daemon serves one rank.
  struct Claim {
    std::string job_name;
    int32_t rank = -1;
    absl::Time sent = absl::InfinitePast();
    absl::Status refusal;  // the coordinator's ClaimRefused, if it answered one
  };

  // The kernel's word on who connects: the daemon's user, root or an --attach-uid, with the pid
  // the hello gives, if any, its own.
  absl::Status CheckPeer(const v1::LocalHello& hello, const PeerCredentials& peer) const;
  // Whether `hello` may attach to `job`: a process resetting into a later epoch (UNAVAILABLE while
  // it waits; the rank asks for it), an attach naming another job or rank, a launched rank's
  // process or one it started.
  absl::Status CheckHello(JobRunner& job, const v1::LocalHello& hello,
                          const PeerCredentials& peer) const;
  // The welcome into `job`, with a dup of its arena's descriptor.
  absl::StatusOr<Welcome> WelcomeInto(JobRunner& job) const;
  // CPU slots: whether the daemon can read the process's memory (tensors reduced where they are).
  static bool CanReadMemory(const v1::LocalHello& hello, const PeerCredentials& peer);
  // Claims `rank` of job `job_name` for a process at the socket (or says how the claim stands):
  // UNAVAILABLE while the job waits for its ranks (the client retries), FAILED_PRECONDITION when
  // the coordinator refused the claim for good.
  absl::Status ClaimRank(const std::string& job_name, int32_t rank);

  const Options options_;
  Jobs& jobs_;
  absl::Mutex claim_mu_;
  Claim claim_ ABSL_GUARDED_BY(claim_mu_);
};

}  // namespace ringmaster
