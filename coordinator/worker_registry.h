// Worker daemons known to the coordinator: registration, heartbeats, lease expiry, and which job
// rank each one serves. Time comes from the injected clock, so lease expiry is tested without
// sleeping.
//
// Thread-safe: one mutex guards the registry.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace ringmaster {

enum class WorkerState { kIdle = 1, kBusy, kLost };

struct Worker {
  std::string id;
  std::string host;
  std::string device;   // "cpu" or "cuda:N"
  std::string address;  // its data plane's numeric address ("": not known)
  std::map<std::string, std::string> labels;
  WorkerState state = WorkerState::kIdle;
  bool connected = false;  // has an open session stream
  absl::Time last_heartbeat;
  std::string job_id;  // when busy
  int32_t rank = -1;
  absl::Time disconnected_since = absl::InfiniteFuture();  // while not connected
  std::string lost_reason;                                 // set by ExpireLeases()
  // Restored after a coordinator restart and not connected since: it is not lost before this.
  absl::Time restored_until = absl::InfinitePast();
  // The daemon process that registered it (0: not known, e.g. restored: the first session's).
  uint64_t incarnation = 0;
  // The authenticated identity that registered it (its certificate's CN; "" without
  // authentication): only that identity may open its session.
  std::string identity;
  std::string slot;  // RegisterWorkerRequest.slot
  // SHA-256 of the session secret issued at registration ("" for a worker restored from a record
  // that has none). Only Register()'s return value carries the secret itself, in `secret`.
  std::string secret_sha256;
  std::string secret;
  // Set when the same identity (or, without authentication, anyone) registered the same host and
  // slot again while this one had no session (its daemon restarted, or re-registered after losing
  // its lease): the new worker's id. ExpireLeases() then reports this one lost and forgets it, so
  // no stale row is left behind.
  std::string replaced_by;
};

absl::string_view WorkerStateName(WorkerState state);  // "IDLE", "BUSY", "LOST"

// INVALID_ARGUMENT naming the field: host 1..253 bytes of [A-Za-z0-9.-_], device "cpu" or "cuda:N".
absl::Status ValidateWorkerPlacement(const std::string& host, const std::string& device);

class WorkerRegistry {
 public:
  // `clock` is borrowed and must outlive the registry.
  // A busy worker whose session broke is lost once `reconnect_grace` passes without a new session
  // (it cannot be serving its rank meanwhile); an idle one only when its lease runs out.
  WorkerRegistry(Clock* clock, absl::Duration lease,
                 absl::Duration reconnect_grace = absl::Seconds(2));

  absl::Duration lease() const { return lease_; }

  // `address`: empty or a numeric IPv4/IPv6 address (INVALID_ARGUMENT naming the field otherwise).
  // Issues a session secret (in the returned Worker's `secret`). A non-empty `identity` that
  // already holds a worker of the same host and non-empty `slot` whose session is not connected
  // replaces it (see Worker::replaced_by). `slot`: at most 256 bytes.
  absl::StatusOr<Worker> Register(std::string host, std::string device,
                                  std::map<std::string, std::string> labels,
                                  uint64_t incarnation = 0, std::string address = "",
                                  std::string identity = "", std::string slot = "");
  // A session of the worker from daemon `incarnation`: NOT_FOUND when the worker was registered
  // by another daemon (two daemons must never share an id); a restored worker takes the first.
  absl::Status CheckIncarnation(const std::string& id, uint64_t incarnation);
  // A session opened by `identity` with `secret`: NOT_FOUND for an unknown id, PERMISSION_DENIED
  // when the worker is bound to another identity, UNAUTHENTICATED when the secret is not the one
  // its registration issued.
  absl::Status CheckSessionProof(const std::string& id, const std::string& identity,
                                 const std::string& secret);

  // NOT_FOUND for an unknown id; FAILED_PRECONDITION once the worker's lease has expired.
  absl::StatusOr<Worker> Get(const std::string& id) const;
  absl::Status Heartbeat(const std::string& id);
  absl::Status SetConnected(const std::string& id, bool connected);

  // Workers that are idle and connected.
  std::vector<Worker> Available() const;
  std::vector<Worker> List() const;

  // Marks the workers busy with `job_id`, worker i serving ranks[i]. FAILED_PRECONDITION (nothing
  // changed) unless every one is idle and connected.
  absl::Status Assign(const std::vector<std::string>& ids, const std::string& job_id,
                      const std::vector<int32_t>& ranks);
  // Returns a busy worker to idle (no-op for a lost or unknown one).
  void Release(const std::string& id);
  // An elastic job's new epoch renumbered the rank that busy worker `id` serves for `job_id`.
  // FAILED_PRECONDITION when it does not serve that job.
  absl::Status Renumber(const std::string& id, const std::string& job_id, int32_t rank);

  // After a coordinator restart: a worker that served rank `rank` of running job `job_id`, known
  // again (busy, not connected) so that its daemon's session reattaches; it is lost unless it
  // connects by `until`. FAILED_PRECONDITION when the id is known already.
  // `identity` and `secret_sha256` are what its registration bound (RankInfo keeps them).
  absl::Status Restore(const std::string& id, std::string host, std::string device,
                       const std::string& job_id, int32_t rank, absl::Time until,
                       std::string address = "", std::string identity = "",
                       std::string secret_sha256 = "");
  // New workers are numbered after `id` ("worker-NNNNNN"; others are ignored): no id is used twice.
  void ReserveId(const std::string& id);

  // The coordinator itself did not run for a while (paused, stalled): whatever its workers sent
  // meanwhile has not been read yet, so every lease, and every busy worker's reconnect grace,
  // starts again from now instead of being judged by the silence. Lost workers stay lost.
  void RenewLeases();
  // Marks as lost every worker whose last heartbeat is older than the lease, and every busy worker
  // disconnected for longer than the reconnect grace; returns them as they were (with the job they
  // served) and `lost_reason` saying which.
  std::vector<Worker> ExpireLeases();

 private:
  absl::StatusOr<Worker*> FindLocked(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Clock* const clock_;
  const absl::Duration lease_;
  const absl::Duration reconnect_grace_;
  mutable absl::Mutex mu_;
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<std::string, Worker> workers_ ABSL_GUARDED_BY(mu_);  // ordered by id
};

}  // namespace ringmaster
