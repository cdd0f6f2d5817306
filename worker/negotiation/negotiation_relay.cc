#include "worker/negotiation/negotiation_relay.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/framing.h"
#include "common/negotiation_wire.h"
#include "common/relay_plan.h"
#include "common/secret.h"
#include "spdlog/spdlog.h"

namespace ringmaster {
namespace {

// A socket in the abstract namespace: `name` without its leading NUL.
sockaddr_un AbstractAddress(const std::string& name, socklen_t* length) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const size_t n = std::min(name.size(), sizeof(addr.sun_path) - 1);
  std::memcpy(addr.sun_path + 1, name.data(), n);
  *length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return addr;
}

// A write to a peer that does not read its link for this long closes the link (the peer then
// resumes on its own session), rather than holding up the relay's session thread.
void SetSendTimeout(int fd, absl::Duration d) {
  timeval tv = absl::ToTimeval(d);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

// At most this many batches wait in a link before it is connected, or in the hub.
constexpr size_t kMaxWaiting = 4096;

// How long each side waits for the other's first frame (the challenge, the open), and a link for
// its TCP connect to the relay.
constexpr absl::Duration kHandshakeTimeout = absl::Seconds(10);
constexpr absl::Duration kConnectTimeout = absl::Seconds(5);

// The handshake's frames (a challenge, an open) are small: a peer not yet trusted makes the relay
// hold no more than this.
constexpr uint32_t kMaxHandshakeBytes = 4096;

// A TCP link between hosts: batches and lists are small and answered at once, so no Nagle delay;
// and a peer host gone silent (its link down, with no FIN) ends the link within about 5 s, as
// keepalive probes or unacknowledged data time out, so its ranks resume on their own sessions
// rather than wait on a relay that cannot hear them.
void TuneTcp(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  int idle = 2, interval = 1, count = 3;
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
  unsigned int user_timeout_ms = 5000;
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof(user_timeout_ms));
}

// What a peer's proof is an HMAC of (RelayLinkOpen.proof).
std::string ProofText(const std::string& job_id, int64_t epoch, int32_t rank,
                      const std::string& nonce) {
  return absl::StrCat("ringmaster relay link\n", job_id, "\n", epoch, "\n", rank, "\n", nonce);
}

// A numeric IPv4 or IPv6 address and a port, as a socket address.
bool TcpAddress(const std::string& host, uint16_t port, sockaddr_storage* out, socklen_t* length) {
  *out = {};
  auto* v4 = reinterpret_cast<sockaddr_in*>(out);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
    *length = sizeof(sockaddr_in);
    return true;
  }
  auto* v6 = reinterpret_cast<sockaddr_in6*>(out);
  if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(port);
    *length = sizeof(sockaddr_in6);
    return true;
  }
  return false;
}

// Connects to what a relay named: "tcp:ADDRESS:PORT" ("tcp:[V6]:PORT"), else an abstract Unix
// name; a TCP connect gives up at `deadline`, or as soon as `cancelled` says so (asked every
// 100 ms). The connected socket, or why not.
absl::StatusOr<int> ConnectToRelay(const std::string& name, absl::Time deadline,
                                   const std::function<bool()>& cancelled) {
  absl::string_view rest = name;
  if (!absl::ConsumePrefix(&rest, "tcp:")) {
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    socklen_t length;
    sockaddr_un addr = AbstractAddress(name, &length);
    if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&addr), length) != 0) {
      const std::string why = std::strerror(errno);
      if (fd >= 0) close(fd);
      return absl::UnavailableError(absl::StrCat("could not be connected: ", why));
    }
    return fd;
  }
  const size_t colon = rest.rfind(':');
  uint32_t port = 0;
  std::string host(rest.substr(0, colon == absl::string_view::npos ? 0 : colon));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  sockaddr_storage addr;
  socklen_t length;
  if (colon == absl::string_view::npos || !absl::SimpleAtoi(rest.substr(colon + 1), &port) ||
      port == 0 || port > 65535 || !TcpAddress(host, static_cast<uint16_t>(port), &addr, &length)) {
    return absl::UnavailableError(
        absl::StrCat("could not be connected: its name '", name, "' is not tcp:ADDRESS:PORT"));
  }
  const int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  int rc = connect(fd, reinterpret_cast<sockaddr*>(&addr), length);
  if (rc != 0 && errno == EINPROGRESS) {
    // A host that does not answer is given up at the deadline, not after the kernel's retries.
    int error = ETIMEDOUT;
    while (absl::Now() < deadline && !cancelled()) {
      pollfd p{fd, POLLOUT, 0};
      const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
      const int ready = poll(&p, 1, static_cast<int>(std::clamp<int64_t>(ms, 0, 100)));
      if (ready < 0 && errno == EINTR) continue;
      if (ready == 0) continue;
      error = errno;
      socklen_t size = sizeof(error);
      if (ready == 1) getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size);
      break;
    }
    rc = error == 0 ? 0 : -1;
    errno = error;
  }
  if (rc != 0) {
    const std::string why = std::strerror(errno);
    close(fd);
    return absl::UnavailableError(absl::StrCat("could not be connected at ", name, ": ", why));
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  TuneTcp(fd);
  return fd;
}

}  // namespace

RelayPlan PlanRelay(const v1::JobAssignment& assignment) {
  RelayPlan plan;
  const v1::Job& job = assignment.job();
  if (!job.spec().knobs().negotiation_relay()) return plan;
  const int32_t rank = assignment.rank();
  if (rank < 0 || rank >= job.ranks_size()) return plan;
  const int32_t n = job.ranks_size();
  std::vector<RelayMember> members(n);
  for (int32_t r = 0; r < n; ++r) {
    // The coordinator plans on its ranks by index; an assignment that lists them otherwise (not
    // one it sends) gets no relay rather than a plan of its own.
    if (job.ranks(r).rank() != r) return plan;
    members[r] = {job.ranks(r).host(), job.ranks(r).worker_identity()};
  }
  const std::vector<int32_t> relays =
      PlanRelays(members, job.spec().knobs().negotiation_relay_hosts());
  plan.relay_rank = relays[rank];
  if (plan.relay_rank < 0) return plan;
  for (int32_t r = 0; r < n; ++r) {
    if (relays[r] != plan.relay_rank) continue;
    plan.ranks.push_back(r);
    plan.spans_hosts = plan.spans_hosts || members[r].host != members[plan.relay_rank].host;
  }
  return plan;
}

std::string RelayKey(int32_t rank) { return absl::StrCat("relay/", rank); }

// ---- RelayHub ----

RelayHub::RelayHub(Options options)
    : options_(std::move(options)),
      linger_(std::clamp(options_.linger, absl::Microseconds(100), absl::Seconds(1))) {
  if (options_.metrics == nullptr) return;
  const Labels labels = {
      {"job", options_.job_id}, {"rank", absl::StrCat(options_.rank)}, {"host", options_.host}};
  batches_total_ = &options_.metrics->GetCounter(
      "ringmaster_relay_batches_total",
      "Request batches this negotiation relay sent to the coordinator (its own rank's and its "
      "peers').",
      labels);
  messages_total_ = &options_.metrics->GetCounter(
      "ringmaster_relay_messages_total",
      "Messages (RelayedBatches) this negotiation relay sent to the coordinator.", labels);
  links_ = &options_.metrics->GetGauge("ringmaster_relay_links",
                                       "Peer ranks whose links to this negotiation relay are open.",
                                       labels);
  links_->Set(0);
}

absl::StatusOr<std::unique_ptr<RelayHub>> RelayHub::Start(Options options) {
  std::unique_ptr<RelayHub> hub(new RelayHub(std::move(options)));
  const std::string& tcp = hub->options_.tcp_address;
  if (tcp.empty()) {
    std::random_device random;
    hub->name_ = absl::StrCat("ringmaster-relay-", hub->options_.job_id, "-", hub->options_.epoch,
                              "-", hub->options_.rank, "-", getpid(), "-", random());
    hub->listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (hub->listen_fd_ < 0) {
      return absl::UnavailableError(absl::StrCat("relay socket: ", std::strerror(errno)));
    }
    socklen_t length;
    sockaddr_un addr = AbstractAddress(hub->name_, &length);
    if (bind(hub->listen_fd_, reinterpret_cast<sockaddr*>(&addr), length) != 0 ||
        listen(hub->listen_fd_, SOMAXCONN) != 0) {
      return absl::UnavailableError(absl::StrCat("relay socket: ", std::strerror(errno)));
    }
  } else {
    sockaddr_storage addr;
    socklen_t length;
    if (!TcpAddress(tcp, 0, &addr, &length)) {
      return absl::InvalidArgumentError(
          absl::StrCat("relay address '", tcp, "' is not a numeric address"));
    }
    hub->listen_fd_ = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (hub->listen_fd_ < 0 ||
        bind(hub->listen_fd_, reinterpret_cast<sockaddr*>(&addr), length) != 0 ||
        listen(hub->listen_fd_, SOMAXCONN) != 0 ||
        getsockname(hub->listen_fd_, reinterpret_cast<sockaddr*>(&addr), &length) != 0) {
      return absl::UnavailableError(
          absl::StrCat("relay socket on ", tcp, ": ", std::strerror(errno)));
    }
    const uint16_t port =
        ntohs(addr.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&addr)->sin_port
                                        : reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
    hub->name_ = addr.ss_family == AF_INET ? absl::StrCat("tcp:", tcp, ":", port)
                                           : absl::StrCat("tcp:[", tcp, "]:", port);
  }
  hub->acceptor_ = std::thread([h = hub.get()] {
    h->Publish();
    h->AcceptLoop();
  });
  hub->flusher_ = std::thread([h = hub.get()] { h->FlushLoop(); });
  return hub;
}

void RelayHub::Publish() {
  if (absl::Status s = options_.store->Set(RelayKey(options_.rank), name_); !s.ok()) {
    absl::MutexLock send_lock(&send_mu_);
    FailLocked(absl::StrCat("its socket could not be named in the rendezvous store: ", s.message()),
               true);
  }
}

RelayHub::~RelayHub() {
  std::vector<std::shared_ptr<Peer>> connections;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    connections = connections_;
    spdlog::info("job {} relay rank {}: relayed {} request batches of its ranks in {} messages",
                 options_.job_id, options_.rank, relayed_batches_, messages_sent_);
  }
  if (listen_fd_ >= 0) shutdown(listen_fd_, SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();
  if (flusher_.joinable()) flusher_.join();
  {
    absl::MutexLock lock(&mu_);
    connections = connections_;  // the acceptor added no more after stopping_
  }
  for (const auto& peer : connections) {
    shutdown(peer->fd, SHUT_RDWR);
    if (peer->reader.joinable()) peer->reader.join();
    close(peer->fd);
  }
  if (listen_fd_ >= 0) close(listen_fd_);
}

void RelayHub::AcceptLoop() {
  while (true) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;  // shut down
    }
    auto peer = std::make_shared<Peer>();
    {
      absl::MutexLock write_lock(&peer->write_mu);
      peer->fd = fd;
    }
    SetSendTimeout(fd, absl::Seconds(5));
    if (!options_.tcp_address.empty()) TuneTcp(fd);
    // Connections whose readers returned (refused, or closed) give their slots back.
    std::vector<std::shared_ptr<Peer>> finished;
    {
      absl::MutexLock lock(&mu_);
      auto done = [](const std::shared_ptr<Peer>& p) { return p->done.load(); };
      for (const auto& p : connections_) {
        if (done(p)) finished.push_back(p);
      }
      connections_.erase(std::remove_if(connections_.begin(), connections_.end(), done),
                         connections_.end());
    }
    for (const auto& p : finished) {
      p->reader.join();
      absl::MutexLock write_lock(&p->write_mu);
      close(p->fd);
      p->fd = -1;  // a Deliver that still holds it writes nothing
    }
    absl::MutexLock lock(&mu_);
    if (stopping_ || connections_.size() >= options_.peers.size() + 8) {
      close(fd);  // more connections than the host has ranks: not peers
      if (stopping_) return;
      continue;
    }
    connections_.push_back(peer);
    peer->reader = std::thread([this, peer] { ReadLoop(peer); });
  }
}

void RelayHub::ReadLoop(std::shared_ptr<Peer> peer) {
  // Marked when this returns (after its ClosePeer), so the acceptor may reap the connection.
  struct MarkDone {
    Peer* peer;
    ~MarkDone() { peer->done.store(true); }
  } mark{peer.get()};
  // The peer proves that it holds the token with an HMAC of a nonce, so the token never travels.
  v1::RelayLinkChallenge challenge;
  challenge.set_nonce(RandomSecret());
  {
    absl::MutexLock write_lock(&peer->write_mu);
    if (!WriteFrame(peer->fd, challenge).ok()) return ClosePeer(peer);
  }
  v1::RelayLinkMessage m;
  // A connection that does not open its link within 10 s is closed (it holds a slot).
  if (!ReadFrameBy(peer->fd, &m, kMaxHandshakeBytes, absl::Now() + kHandshakeTimeout).ok()) {
    return ClosePeer(peer);
  }
  const v1::RelayLinkOpen& open = m.open();
  const bool a_peer =
      std::find(options_.peers.begin(), options_.peers.end(), open.rank()) != options_.peers.end();
  const std::string proof = HmacSha256Hex(
      options_.token, ProofText(open.job_id(), open.epoch(), open.rank(), challenge.nonce()));
  if (m.kind_case() != v1::RelayLinkMessage::kOpen || open.job_id() != options_.job_id ||
      open.epoch() != options_.epoch || proof.empty() || !ConstantTimeEquals(open.proof(), proof) ||
      !a_peer) {
    spdlog::warn("job {} relay rank {}: refused a link from rank {} of job {} epoch {}",
                 options_.job_id, options_.rank, open.rank(), open.job_id(), open.epoch());
    return ClosePeer(peer);
  }
  bool taken = false;
  {
    absl::MutexLock lock(&mu_);
    if (!failed_ && !stopping_ && !peers_.contains(open.rank())) {
      peer->rank = open.rank();
      peers_[open.rank()] = peer;
      taken = true;
      if (links_ != nullptr) links_->Set(static_cast<double>(peers_.size()));
    }
  }
  if (!taken) return ClosePeer(peer);
  spdlog::info("job {} relay rank {}: rank {} negotiates through this daemon", options_.job_id,
               options_.rank, open.rank());
  while (ReadFrame(peer->fd, &m).ok()) {
    if (m.kind_case() != v1::RelayLinkMessage::kBatch || m.batch().rank() != peer->rank ||
        m.batch().job_id() != options_.job_id || m.batch().epoch() != options_.epoch) {
      spdlog::warn("job {} relay rank {}: rank {} sent a frame that is not its batch; link closed",
                   options_.job_id, options_.rank, peer->rank);
      break;
    }
    Add(peer->rank, std::move(*m.mutable_batch()));
  }
  ClosePeer(peer);
}

void RelayHub::ClosePeer(const std::shared_ptr<Peer>& peer) {
  shutdown(peer->fd, SHUT_RDWR);  // the reader ends; the fd is closed when the hub goes
  absl::MutexLock lock(&mu_);
  if (peer->rank >= 0) {
    auto it = peers_.find(peer->rank);
    if (it != peers_.end() && it->second == peer) peers_.erase(it);
    if (links_ != nullptr) links_->Set(static_cast<double>(peers_.size()));
  }
}

bool RelayHub::Submit(const v1::RequestBatch& batch) {
  {
    absl::MutexLock lock(&mu_);
    if (failed_) return false;
  }
  Add(options_.rank, batch);
  return true;
}

void RelayHub::Add(int32_t rank, v1::RequestBatch batch) {
  bool all_in;
  bool overflow = false;
  {
    absl::MutexLock lock(&mu_);
    if (failed_) return;  // its rank resumes on its own session, which sends it again
    overflow = pending_.size() >= kMaxWaiting;
  }
  if (overflow) {
    // A batch dropped here would leave a gap in its rank's numbers: relaying ends, and every
    // rank of the host resumes on its own session.
    absl::MutexLock send_lock(&send_mu_);
    return FailLocked(absl::StrCat(kMaxWaiting, " batches wait to be sent"), true);
  }
  {
    absl::MutexLock lock(&mu_);
    if (failed_) return;
    if (pending_.empty()) first_pending_ = absl::Now();
    pending_.push_back(std::move(batch));
    ++pending_of_[rank];
    // Every rank attached to this relay (itself and its open links) has a batch waiting.
    all_in = pending_of_.contains(options_.rank);
    for (const auto& [r, peer] : peers_) all_in = all_in && pending_of_.contains(r);
  }
  if (all_in) SendPending();
}

void RelayHub::FlushLoop() {
  // Sends what waits once its first batch has waited the linger (the others' have not come).
  struct Watch {
    RelayHub* hub;
    absl::Time seen;  // the first waiting batch's arrival when the wait began
  };
  auto changed = +[](Watch* w) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return w->hub->stopping_ || w->hub->first_pending_ != w->seen;
  };
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    Watch watch{this, first_pending_};
    if (first_pending_ == absl::InfiniteFuture()) {
      mu_.Await(absl::Condition(changed, &watch));
      continue;
    }
    const absl::Time due = first_pending_ + linger_;
    if (mu_.AwaitWithDeadline(absl::Condition(changed, &watch), due)) continue;
    mu_.Unlock();
    SendPending();
    mu_.Lock();
  }
}

void RelayHub::SendPending() {
  absl::MutexLock send_lock(&send_mu_);
  std::vector<v1::WorkerMessage> messages;
  {
    absl::MutexLock lock(&mu_);
    if (pending_.empty() || failed_) return;
    for (size_t i = 0; i < pending_.size(); ++i) {
      if (i % kMaxBatchesPerMessage == 0) messages.emplace_back();
      *messages.back().mutable_relayed()->add_batches() = std::move(pending_[i]);
    }
    relayed_batches_ += static_cast<int64_t>(pending_.size());
    messages_sent_ += static_cast<int64_t>(messages.size());
    if (batches_total_ != nullptr) {
      batches_total_->Increment(static_cast<double>(pending_.size()));
      messages_total_->Increment(static_cast<double>(messages.size()));
    }
    pending_.clear();
    pending_of_.clear();
    first_pending_ = absl::InfiniteFuture();
  }
  for (v1::WorkerMessage& m : messages) ShareCachedIds(m.mutable_relayed());
  for (const v1::WorkerMessage& m : messages) {
    if (absl::Status s = options_.send(m); !s.ok()) {
      return FailLocked(absl::StrCat("the relay's session to the coordinator: ", s.message()),
                        true);
    }
  }
}

std::optional<v1::ResponseList> RelayHub::Deliver(const v1::RelayedResponses& relayed) {
  std::optional<v1::ResponseList> own;
  std::map<int32_t, const v1::ResponseList*> notices;
  for (const v1::RelayedNotice& n : relayed.notices()) notices[n.rank()] = &n.part();
  for (int32_t rank : relayed.ranks()) {
    v1::ResponseList list = relayed.list();
    if (auto it = notices.find(rank); it != notices.end()) list.MergeFrom(*it->second);
    if (rank == options_.rank) {
      own = std::move(list);
      continue;
    }
    std::shared_ptr<Peer> peer;
    {
      absl::MutexLock lock(&mu_);
      auto it = peers_.find(rank);
      if (it != peers_.end()) peer = it->second;
    }
    // A peer whose link closed resumes on its own session, which re-sends it what it lacks.
    if (peer == nullptr) continue;
    absl::MutexLock write_lock(&peer->write_mu);
    if (peer->fd < 0 || !WriteFrame(peer->fd, list).ok()) ClosePeer(peer);
  }
  return own;
}

void RelayHub::Fail(const std::string& why) {
  absl::MutexLock send_lock(&send_mu_);
  FailLocked(why, false);
}

void RelayHub::FailLocked(const std::string& why, bool notify) {
  std::map<int32_t, std::shared_ptr<Peer>> peers;
  {
    absl::MutexLock lock(&mu_);
    if (failed_) return;
    failed_ = true;
    peers.swap(peers_);
    if (links_ != nullptr) links_->Set(0);
    pending_.clear();
    pending_of_.clear();
    first_pending_ = absl::InfiniteFuture();
  }
  // Fail() is the daemon's own end of relaying (its rank stopped or finished): no fault.
  spdlog::log(notify ? spdlog::level::warn : spdlog::level::info,
              "job {} relay rank {}: relaying ends ({}); the {} other ranks it relayed for "
              "negotiate on their own sessions",
              options_.job_id, options_.rank, why, peers.size());
  for (const auto& [rank, peer] : peers) {
    absl::MutexLock write_lock(&peer->write_mu);
    if (peer->fd >= 0) shutdown(peer->fd, SHUT_RDWR);
  }
  if (notify && options_.on_failed) options_.on_failed(why);
}

int RelayHub::attached() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(peers_.size());
}

int64_t RelayHub::relayed_batches() const {
  absl::MutexLock lock(&mu_);
  return relayed_batches_;
}

int64_t RelayHub::messages_sent() const {
  absl::MutexLock lock(&mu_);
  return messages_sent_;
}

// ---- RelayLink ----

RelayLink::RelayLink(Options options) : options_(std::move(options)) {}

std::unique_ptr<RelayLink> RelayLink::Start(Options options) {
  std::unique_ptr<RelayLink> link(new RelayLink(std::move(options)));
  link->thread_ = std::thread([l = link.get()] { l->Run(); });
  return link;
}

RelayLink::~RelayLink() {
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
    if (fd_ >= 0) shutdown(fd_, SHUT_RDWR);
  }
  if (thread_.joinable()) thread_.join();
  absl::MutexLock lock(&mu_);
  if (fd_ >= 0) close(fd_);
}

void RelayLink::Lose(const absl::Status& why) {
  {
    absl::MutexLock lock(&mu_);
    if (lost_) return;
    lost_ = true;
    queued_.clear();
    if (fd_ >= 0) shutdown(fd_, SHUT_RDWR);
    if (closing_) return;
  }
  if (options_.on_lost) options_.on_lost(why);
}

RelayLink::Sent RelayLink::Send(const v1::RequestBatch& batch) {
  absl::MutexLock write_lock(&write_mu_);
  int fd;
  {
    absl::MutexLock lock(&mu_);
    if (lost_) return resumed_ ? Sent::kDirect : Sent::kHeld;
    if (!connected_ && queued_.size() < kMaxWaiting) {
      queued_.push_back(batch);
      return Sent::kTaken;
    }
    fd = connected_ ? fd_ : -1;
  }
  if (fd < 0) {
    Lose(absl::ResourceExhaustedError("has not connected and too many batches wait"));
    return Sent::kHeld;
  }
  v1::RelayLinkMessage m;
  *m.mutable_batch() = batch;
  if (absl::Status s = WriteFrame(fd, m); !s.ok()) {
    Lose(absl::UnavailableError(absl::StrCat("broke: ", s.message())));
    return Sent::kHeld;
  }
  return Sent::kTaken;
}

void RelayLink::Stop() {
  absl::MutexLock lock(&mu_);
  closing_ = true;
  lost_ = true;
  resumed_ = true;
  queued_.clear();
  if (fd_ >= 0) shutdown(fd_, SHUT_RDWR);
}

void RelayLink::EndRelaying() {
  absl::MutexLock lock(&mu_);
  const bool was_lost = lost_;
  lost_ = true;
  resumed_ = true;
  queued_.clear();
  if (fd_ >= 0) shutdown(fd_, SHUT_RDWR);
  if (!was_lost) {
    spdlog::info(
        "job {} rank {}: its session resumed; it negotiates on it from now on, not "
        "through relay rank {}",
        options_.job_id, options_.rank, options_.relay_rank);
  }
}

void RelayLink::Run() {
  // In slices, so that a link destroyed meanwhile is not held up.
  const absl::Time give_up = absl::Now() + options_.find_timeout;
  absl::StatusOr<std::vector<std::string>> name;
  while (true) {
    name = options_.store->Wait({RelayKey(options_.relay_rank)},
                                std::min(absl::Milliseconds(250), give_up - absl::Now()));
    if (name.ok()) break;
    {
      absl::MutexLock lock(&mu_);
      if (closing_) return;
    }
    if (name.status().code() != absl::StatusCode::kDeadlineExceeded || absl::Now() >= give_up) {
      return Lose(
          absl::UnavailableError(absl::StrCat("could not be found: ", name.status().message())));
    }
  }
  if ((*name)[0].empty()) {
    return Lose(absl::UnavailableError("could not be found: the relay could not listen"));
  }
  absl::StatusOr<int> connected = ConnectToRelay((*name)[0], absl::Now() + kConnectTimeout, [this] {
    absl::MutexLock lock(&mu_);
    return closing_ || lost_;
  });
  if (!connected.ok()) return Lose(connected.status());
  const int fd = *connected;
  SetSendTimeout(fd, absl::Seconds(5));
  {
    absl::MutexLock lock(&mu_);
    fd_ = fd;
    if (closing_ || lost_) return;  // destroyed, or relaying ended (EndRelaying) meanwhile
  }
  v1::RelayLinkChallenge challenge;
  if (absl::Status s =
          ReadFrameBy(fd, &challenge, kMaxHandshakeBytes, absl::Now() + kHandshakeTimeout);
      !s.ok()) {
    return Lose(absl::UnavailableError(absl::StrCat("sent no challenge: ", s.message())));
  }
  absl::Status opened;
  {
    // Open, then what was queued meanwhile, in order, before any newer batch.
    absl::MutexLock write_lock(&write_mu_);
    v1::RelayLinkMessage open;
    open.mutable_open()->set_job_id(options_.job_id);
    open.mutable_open()->set_epoch(options_.epoch);
    open.mutable_open()->set_rank(options_.rank);
    open.mutable_open()->set_proof(HmacSha256Hex(
        options_.token,
        ProofText(options_.job_id, options_.epoch, options_.rank, challenge.nonce())));
    absl::Status s = WriteFrame(fd, open);
    std::deque<v1::RequestBatch> queued;
    {
      absl::MutexLock lock(&mu_);
      queued.swap(queued_);
    }
    for (const v1::RequestBatch& b : queued) {
      if (!s.ok()) break;
      v1::RelayLinkMessage m;
      *m.mutable_batch() = b;
      s = WriteFrame(fd, m);
    }
    opened = s;
    absl::MutexLock lock(&mu_);
    connected_ = s.ok();
  }
  if (!opened.ok()) return Lose(absl::UnavailableError(absl::StrCat("broke: ", opened.message())));
  v1::ResponseList list;
  absl::Status s;
  while ((s = ReadFrame(fd, &list)).ok()) {
    if (options_.on_list) options_.on_list(std::move(list));
    list.Clear();
  }
  Lose(absl::UnavailableError(absl::StrCat("closed: ", s.message())));
}

}  // namespace ringmaster
