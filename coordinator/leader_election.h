// Leader election among coordinator replicas that keep their jobs in one etcd
// (`--store etcd://...`), on etcd's documented v3 API: each replica holds a lease (TTL, default
// 5 s) that it keeps alive, and campaigns with a transaction that creates the key PREFIX/leader,
// holding its identity (the address clients reach it at) under its lease, only when the key does
// not exist. Whoever created it leads until its lease expires (its process died, or it lost etcd
// for a TTL) or it resigns (the lease revoked: a follower takes over at once). Followers read the
// key to name the leader to clients. No consensus of our own: etcd's transaction decides.
//
// A replica restarted at the same address finds the key naming itself under an old lease and takes
// it over at once, instead of waiting out the TTL: its address could not be bound while the old
// process lived. Identities must therefore be unique per replica.
//
// Thread-safe. One thread keeps the lease alive and campaigns; the methods read what it found.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ringmaster {

class EtcdClient;

struct LeaderElectionOptions {
  std::string prefix = "/ringmaster";  // the key is PREFIX/leader
  std::string identity;                // this replica's address for clients: the key's value
  absl::Duration ttl = absl::Seconds(5);
  // How often a follower tries to take the key (the takeover comes this late at most after the
  // old leader's lease is gone).
  absl::Duration campaign_interval = absl::Milliseconds(200);
};

class LeaderElection {
 public:
  LeaderElection(std::unique_ptr<EtcdClient> etcd, LeaderElectionOptions options);
  ~LeaderElection();  // stops campaigning; does not resign (a crash does not either)

  void Start();

  // Returns OK once this replica leads, CANCELLED once `stop()` is true (polled every 50 ms).
  absl::Status AwaitLeadership(const std::function<bool()>& stop);

  const std::string& key() const { return key_; }
  // The leader's identity as last read ("" when none is known); this replica's own while it leads.
  std::string leader() const;
  bool leading() const;
  // While leading: the leader key's create revision, which fences the store's writes.
  int64_t revision() const;
  // Leadership was held and is gone: the lease could not be kept alive for most of its TTL, or the
  // key is no longer the one this replica created. The replica must stop acting as leader at once.
  // Why, in words ("" while not lost).
  std::string lost() const;

  // Stops campaigning and revokes the lease: the key goes with it, and a follower takes over
  // without waiting for the TTL. Best effort (etcd may be gone).
  void Resign();

 private:
  void Loop();
  // One round: keep the lease alive (or get one), then campaign or check the key is still ours.
  void Round();
  void Campaign();
  void CheckKey();
  void Lose(const std::string& why);

  const std::unique_ptr<EtcdClient> etcd_;
  const LeaderElectionOptions options_;
  const std::string key_;
  std::thread thread_;

  // The election thread's own (Resign() reads lease_ after joining it).
  int64_t lease_ = 0;
  absl::Time lease_renewed_ = absl::InfinitePast();  // the last keep-alive etcd answered

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::string leader_ ABSL_GUARDED_BY(mu_);
  bool leading_ ABSL_GUARDED_BY(mu_) = false;
  int64_t revision_ ABSL_GUARDED_BY(mu_) = 0;
  std::string lost_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ringmaster
