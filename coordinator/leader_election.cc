#include "coordinator/leader_election.h"

#include "absl/strings/str_cat.h"
#include "coordinator/etcd_client.h"
#include "spdlog/spdlog.h"

namespace ringmaster {

LeaderElection::LeaderElection(std::unique_ptr<EtcdClient> etcd, LeaderElectionOptions options)
    : etcd_(std::move(etcd)), options_(std::move(options)), key_(options_.prefix + "/leader") {}

LeaderElection::~LeaderElection() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void LeaderElection::Start() {
  thread_ = std::thread([this] { Loop(); });
}

std::string LeaderElection::leader() const {
  absl::MutexLock lock(&mu_);
  return leader_;
}

bool LeaderElection::leading() const {
  absl::MutexLock lock(&mu_);
  return leading_;
}

int64_t LeaderElection::revision() const {
  absl::MutexLock lock(&mu_);
  return revision_;
}

std::string LeaderElection::lost() const {
  absl::MutexLock lock(&mu_);
  return lost_;
}

absl::Status LeaderElection::AwaitLeadership(const std::function<bool()>& stop) {
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return leading_ || stopping_; };
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&done), absl::Milliseconds(50))) {
        if (leading_) return absl::OkStatus();
        return absl::CancelledError("stopped before this replica led");
      }
    }
    // Asked with the lock released: `stop` is the caller's.
    if (stop()) return absl::CancelledError("stopped before this replica led");
  }
}

void LeaderElection::Resign() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    leading_ = false;
  }
  if (thread_.joinable()) thread_.join();
  if (lease_ == 0) return;
  // No lock held: a call to etcd (bounded by the client's timeout).
  if (absl::Status s = etcd_->RevokeLease(lease_); !s.ok()) {
    spdlog::warn("resigning the leadership: {} (a follower takes over when the lease expires)",
                 s.ToString());
  } else {
    spdlog::info("resigned the leadership ({} deleted)", key_);
  }
  lease_ = 0;
}

void LeaderElection::Loop() {
  while (true) {
    Round();
    // Followers campaign often; a leader needs only keep its lease (a third of the TTL, so two
    // keep-alives can fail before the lease is in danger).
    const absl::Duration pause = leading() ? options_.ttl / 3 : options_.campaign_interval;
    absl::MutexLock lock(&mu_);
    auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
    if (mu_.AwaitWithTimeout(absl::Condition(&stopping), pause)) return;
  }
}

void LeaderElection::Lose(const std::string& why) {
  spdlog::error("lost the leadership: {}", why);
  absl::MutexLock lock(&mu_);
  leading_ = false;
  lost_ = why;
  leader_.clear();
}

void LeaderElection::Round() {
  const bool was_leading = leading();
  if (lease_ == 0) {
    absl::StatusOr<int64_t> lease = etcd_->GrantLease(options_.ttl);
    if (!lease.ok()) {
      spdlog::warn("no lease from etcd to campaign with: {}", lease.status().ToString());
      return;
    }
    lease_ = *lease;
    lease_renewed_ = absl::Now();
  } else if (absl::Now() - lease_renewed_ >= options_.ttl / 3) {
    const absl::Time asked = absl::Now();
    absl::StatusOr<absl::Duration> ttl = etcd_->KeepAlive(lease_);
    if (ttl.ok() && *ttl > absl::ZeroDuration()) {
      lease_renewed_ = asked;
    } else if (ttl.ok()) {  // expired: the key went with it
      lease_ = 0;
      if (was_leading)
        Lose(absl::StrCat("the lease expired (no keep-alive within ",
                          absl::FormatDuration(options_.ttl), ")"));
      return;
    } else if (was_leading && absl::Now() - lease_renewed_ >= options_.ttl * 4 / 5) {
      // Etcd out of reach for most of the TTL: the lease may be gone by now, and a follower
      // leading. Step down before that can be so.
      Lose(absl::StrCat("etcd unreachable for ", absl::FormatDuration(absl::Now() - lease_renewed_),
                        " of the lease's ", absl::FormatDuration(options_.ttl), ": ",
                        ttl.status().message()));
      return;
    }
  }
  if (was_leading) {
    CheckKey();
  } else if (lost().empty()) {  // a replica that lost the leadership does not campaign again
    Campaign();
  }
}

void LeaderElection::Campaign() {
  etcdserverpb::TxnRequest txn;
  etcdserverpb::Compare* absent = txn.add_compare();
  absent->set_key(key_);
  absent->set_target(etcdserverpb::Compare::CREATE);
  absent->set_result(etcdserverpb::Compare::EQUAL);
  absent->set_create_revision(0);
  etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
  put->set_key(key_);
  put->set_value(options_.identity);
  put->set_lease(lease_);
  txn.add_failure()->mutable_request_range()->set_key(key_);
  etcdserverpb::TxnResponse out;
  if (absl::Status s = etcd_->Txn(txn, &out); !s.ok()) {
    spdlog::warn("campaigning for the leadership: {}", s.ToString());
    return;
  }
  if (out.succeeded()) {
    spdlog::info("leading: {} = {} (revision {}, lease TTL {})", key_, options_.identity,
                 out.header().revision(), absl::FormatDuration(options_.ttl));
    absl::MutexLock lock(&mu_);
    leading_ = true;
    revision_ = out.header().revision();
    leader_ = options_.identity;
    return;
  }
  if (out.responses_size() == 0 || out.responses(0).response_range().kvs_size() == 0) return;
  const etcdserverpb::KeyValue& held = out.responses(0).response_range().kvs(0);
  if (held.value() == options_.identity && held.lease() != lease_) {
    // This replica's earlier process, which cannot be alive (it would hold the address): take the
    // key over now rather than after its lease's TTL, if it is still that one.
    etcdserverpb::TxnRequest takeover;
    etcdserverpb::Compare* same = takeover.add_compare();
    same->set_key(key_);
    same->set_target(etcdserverpb::Compare::MOD);
    same->set_result(etcdserverpb::Compare::EQUAL);
    same->set_mod_revision(held.mod_revision());
    takeover.add_success()->mutable_request_delete_range()->set_key(key_);
    etcdserverpb::TxnResponse done;
    if (etcd_->Txn(takeover, &done).ok() && done.succeeded()) {
      spdlog::info("{} named this replica's earlier process; taken over", key_);
      Campaign();
    }
    return;
  }
  absl::MutexLock lock(&mu_);
  if (leader_ != held.value()) spdlog::info("following the leader at {}", held.value());
  leader_ = held.value();
}

void LeaderElection::CheckKey() {
  etcdserverpb::RangeRequest range;
  range.set_key(key_);
  etcdserverpb::RangeResponse out;
  if (absl::Status s = etcd_->Range(range, &out); !s.ok()) return;  // the lease decides
  const int64_t mine = revision();
  if (out.kvs_size() == 0) {
    Lose(absl::StrCat(key_, " was deleted"));
  } else if (out.kvs(0).create_revision() != mine) {
    Lose(absl::StrCat(key_, " now names ", out.kvs(0).value(), " (created at revision ",
                      out.kvs(0).create_revision(), ", not ", mine, ")"));
  }
}

}  // namespace ringmaster
