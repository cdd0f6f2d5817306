// The negotiation relay (the job knob negotiation_relay): the daemons of a job's ranks on one host
// negotiate through the daemon of the job's lowest rank there, the relay. Each peer hands its
// numbered request batches to the relay over a Unix socket (RelayLink); the relay sends what it has
// of its host's ranks to the coordinator in one message (RelayedBatches) once every rank attached
// to it has a batch there, or a cycle time after the first one came; the coordinator answers with
// one RelayedResponses per cycle, which the relay splits into each rank's list (RelayHub::Deliver).
// The coordinator thus handles a message per host and cycle, not per rank.
//
// The reliable session stays per rank: batches keep their ranks' numbers, and each rank's ledger
// keeps what it sent until the coordinator acknowledges it. Anything that breaks the path (the
// relay is not found in time, its link closes, the relay's own session breaks) ends relaying for
// the peer for the rest of the epoch: the peer resumes on its own session (RelayLink's `on_lost`),
// which re-sends what the coordinator lacks and takes the rank's lists from then on.
//
// The link is a socket in the abstract namespace (nothing left behind; one network namespace, one
// host) when the relay serves its own host alone, else a TCP connection to the relay's data plane
// address; either is named under the rendezvous key relay/<relay rank>. A peer proves that it holds
// the epoch's rendezvous token (an HMAC of the relay's challenge: the token never travels) and may
// speak only for a rank of the relay's group.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "ringmaster/v1/worker.pb.h"
#include "worker/rendezvous/key_value_store.h"

namespace ringmaster {

// Who relays for this daemon's rank (common/relay_plan.h): the job's ranks on its host, or on its
// group of negotiation_relay_hosts hosts (by RankInfo.host), the lowest of them relaying. No relay
// (relay_rank -1) when the knob is off or the rank is alone in its group.
struct RelayPlan {
  int32_t relay_rank = -1;
  std::vector<int32_t> ranks;  // the group's, in rank order, the relay first
  // The group has ranks on other hosts than the relay's: its links go over TCP.
  bool spans_hosts = false;
  bool relays(int32_t rank) const { return relay_rank == rank; }
};
RelayPlan PlanRelay(const v1::JobAssignment& assignment);

// The rendezvous key under which relay `rank` names its socket.
std::string RelayKey(int32_t rank);

class RelayHub {
 public:
  struct Options {
    std::string job_id;
    int64_t epoch = 0;
    int32_t rank = 0;            // the relay's own
    std::vector<int32_t> peers;  // the other ranks on the host
    std::string token;           // the epoch's rendezvous token
    std::shared_ptr<KeyValueStore> store;
    // Empty: a socket in the abstract namespace, for peers on this host. Else a numeric address
    // to listen on with TCP (port chosen by the kernel), for peers on other hosts too.
    std::string tcp_address;
    // Writes a message on this daemon's session to the coordinator.
    std::function<absl::Status(const v1::WorkerMessage&)> send;
    // How long the first batch waits for the host's other ranks' (bounded to 0.1 ms..1 s).
    absl::Duration linger = absl::Milliseconds(1);
    // The hub failed by itself (a send failed, too many batches waited, its name could not be
    // published): what it held is lost, so the relay's own rank must resume on its session.
    std::function<void(const std::string& why)> on_failed;
    // Where the hub's series go (ringmaster_relay_*, labelled job, rank, host); null: none.
    // Borrowed: must outlive the hub.
    MetricsRegistry* metrics = nullptr;
    std::string host;  // the `host` label
  };
  // At most this many batches go in one RelayedBatches (the coordinator's bound).
  static constexpr int kMaxBatchesPerMessage = 512;
  // Listens, and names the socket in the store (on a thread of its own: a slow rendezvous does
  // not hold up the caller). UNAVAILABLE when it cannot listen.
  static absl::StatusOr<std::unique_ptr<RelayHub>> Start(Options options);
  ~RelayHub();
  RelayHub(const RelayHub&) = delete;
  RelayHub& operator=(const RelayHub&) = delete;

  // The relay's own numbered batch. False once the hub failed: send it on the session.
  bool Submit(const v1::RequestBatch& batch);
  // A RelayedResponses from the coordinator: each peer's list goes to its link; the relay's own
  // rank's list, if the lot has one, is returned.
  std::optional<v1::ResponseList> Deliver(const v1::RelayedResponses& relayed);
  // Relaying ends: the peers' links close (each resumes on its own session, unless its rank is
  // done) and the hub takes nothing more. Waits for a lot being sent, so none goes out after this
  // returns (on the session's next stream, ahead of a resume). Called when the relay's session
  // broke, and when its rank stops.
  void Fail(const std::string& why);

  // Where peers reach it, as the store names it: an abstract socket name, or "tcp:ADDRESS:PORT".
  const std::string& name() const { return name_; }
  // Peers attached now, and request batches relayed so far (for tests and logs).
  int attached() const;
  int64_t relayed_batches() const;
  int64_t messages_sent() const;

 private:
  struct Peer {
    absl::Mutex write_mu;
    // Closed (and set to -1) under write_mu when the connection is reaped; its reader, which
    // has returned by then, reads it unlocked.
    int fd = -1;
    int32_t rank = -1;  // once its link is open
    std::thread reader;
    std::atomic<bool> done{false};  // its reader has returned: the connection may be reaped
  };
  explicit RelayHub(Options options);
  void AcceptLoop();
  void ReadLoop(std::shared_ptr<Peer> peer);
  // Takes a batch of `rank` (the relay's or a peer's); sends the lot when every attached rank has
  // one waiting.
  void Add(int32_t rank, v1::RequestBatch batch);
  void FlushLoop();
  // Sends what waits (under send_mu_, so lots go out in order).
  void SendPending();
  // Fail, with send_mu_ held; `notify`: call on_failed.
  void FailLocked(const std::string& why, bool notify) ABSL_EXCLUSIVE_LOCKS_REQUIRED(send_mu_);
  void Publish();
  void ClosePeer(const std::shared_ptr<Peer>& peer);

  const Options options_;
  const absl::Duration linger_;
  // The hub's series (null without a registry).
  Counter* batches_total_ = nullptr;
  Counter* messages_total_ = nullptr;
  Gauge* links_ = nullptr;
  int listen_fd_ = -1;
  std::string name_;  // what the store names: the abstract name (no NUL), or "tcp:ADDRESS:PORT"
  std::thread acceptor_;
  std::thread flusher_;

  absl::Mutex send_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::shared_ptr<Peer>> connections_ ABSL_GUARDED_BY(mu_);
  std::map<int32_t, std::shared_ptr<Peer>> peers_ ABSL_GUARDED_BY(mu_);  // by rank, open links
  std::vector<v1::RequestBatch> pending_ ABSL_GUARDED_BY(mu_);           // in arrival order
  std::map<int32_t, int> pending_of_ ABSL_GUARDED_BY(mu_);               // batches waiting, by rank
  absl::Time first_pending_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  int64_t relayed_batches_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t messages_sent_ ABSL_GUARDED_BY(mu_) = 0;
};

class RelayLink {
 public:
  struct Options {
    std::string job_id;
    int64_t epoch = 0;
    int32_t rank = 0;
    int32_t relay_rank = 0;
    std::string token;
    std::shared_ptr<KeyValueStore> store;
    // How long to wait for the relay to name its socket.
    absl::Duration find_timeout = absl::Seconds(10);
    // A list from the relay (on the link's thread).
    std::function<void(v1::ResponseList)> on_list;
    // The link is down for good (not called after the link is destroyed): resume on the session.
    // `why` says what happened to the link ("closed: ...", "could not be found: ...").
    std::function<void(const absl::Status&)> on_lost;
  };
  // Finds and connects to the relay in the background; batches sent meanwhile wait.
  static std::unique_ptr<RelayLink> Start(Options options);
  ~RelayLink();
  RelayLink(const RelayLink&) = delete;
  RelayLink& operator=(const RelayLink&) = delete;

  enum class Sent {
    kTaken,   // sent, or queued until the link connects
    kHeld,    // the link is down and the session has not resumed since: the rank's ledger keeps
              // the batch, and the resume re-sends it
    kDirect,  // relaying ended and the session resumed: send it on the session
  };
  // A numbered batch.
  Sent Send(const v1::RequestBatch& batch);
  // The rank's session resumed: relaying ends for it (the link closes, without on_lost), and
  // batches go on the session from now on, after what the resume re-sent.
  void EndRelaying();
  // The rank is done (stopped, or its epoch ended): the link closes without on_lost.
  void Stop();

 private:
  explicit RelayLink(Options options);
  void Run();
  void Lose(const absl::Status& why);

  const Options options_;
  std::thread thread_;
  absl::Mutex write_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  int fd_ ABSL_GUARDED_BY(mu_) = -1;
  bool connected_ ABSL_GUARDED_BY(mu_) = false;
  bool lost_ ABSL_GUARDED_BY(mu_) = false;
  bool resumed_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<v1::RequestBatch> queued_ ABSL_GUARDED_BY(mu_);  // before the link connected
};

}  // namespace ringmaster
