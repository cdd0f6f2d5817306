#include "coordinator/rendezvous_store.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ringmaster {
namespace {

absl::Status CheckKey(const std::string& key) {
  if (key.empty() || key.size() > RendezvousStore::kMaxKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("key must be 1..1024 bytes; got ", key.size()));
  }
  return absl::OkStatus();
}

}  // namespace

std::string RendezvousStore::Scope(const std::string& job_id, int64_t epoch) {
  return absl::StrCat(job_id, "/", epoch);
}

absl::Status RendezvousStore::Set(const std::string& scope, const std::string& key,
                                  std::string value) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  if (value.size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("value of key '", key, "' is ", value.size(), " bytes; at most 4 MiB"));
  }
  std::vector<std::pair<WaitCallback, std::vector<std::string>>> ready;
  {
    absl::MutexLock lock(&mu_);
    absl::flat_hash_map<std::string, std::string>& keys = data_[scope];
    Usage& usage = usage_[scope];
    auto existing = keys.find(key);
    const size_t old_bytes = existing == keys.end() ? 0 : key.size() + existing->second.size();
    if (existing == keys.end() && keys.size() >= kMaxScopeKeys) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the rendezvous of ", scope, " holds ", keys.size(),
                       " keys, the most one job epoch may; key '", key.substr(0, 64), "' not set"));
    }
    if (usage.bytes - old_bytes + key.size() + value.size() > kMaxScopeBytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the rendezvous of ", scope, " would hold more than ", kMaxScopeBytes >> 20,
                       " MiB, the most one job epoch may; key '", key.substr(0, 64), "' not set"));
    }
    usage.bytes = usage.bytes - old_bytes + key.size() + value.size();
    keys[key] = std::move(value);
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      std::optional<std::vector<std::string>> values;
      if (it->scope == scope) values = CollectLocked(scope, it->keys);
      if (!values) {
        ++it;
        continue;
      }
      ready.emplace_back(std::move(it->done), *std::move(values));
      --usage_[it->scope].waiters;
      it = waiters_.erase(it);
    }
  }
  // Callbacks run unlocked: they may call back into the store.
  for (auto& [done, values] : ready) done(std::move(values));
  return absl::OkStatus();
}

absl::StatusOr<std::string> RendezvousStore::Get(const std::string& scope,
                                                 const std::string& key) const {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  auto sit = data_.find(scope);
  if (sit != data_.end()) {
    if (auto kit = sit->second.find(key); kit != sit->second.end()) return kit->second;
  }
  return absl::NotFoundError(absl::StrCat("key '", key, "' is not set"));
}

std::optional<std::vector<std::string>> RendezvousStore::CollectLocked(
    const std::string& scope, const std::vector<std::string>& keys) const {
  auto sit = data_.find(scope);
  if (sit == data_.end()) return std::nullopt;
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const std::string& key : keys) {
    auto kit = sit->second.find(key);
    if (kit == sit->second.end()) return std::nullopt;
    values.push_back(kit->second);
  }
  return values;
}

void RendezvousStore::Wait(const std::string& scope, std::vector<std::string> keys,
                           absl::Time deadline, WaitCallback done) {
  if (keys.empty() || keys.size() > kMaxWaitKeys) {
    done(absl::InvalidArgumentError(
        absl::StrCat("keys must hold 1..", kMaxWaitKeys, " keys; got ", keys.size())));
    return;
  }
  for (const std::string& key : keys) {
    if (absl::Status s = CheckKey(key); !s.ok()) {
      done(s);
      return;
    }
  }
  std::optional<std::vector<std::string>> values;
  {
    absl::MutexLock lock(&mu_);
    values = CollectLocked(scope, keys);
    if (!values) {
      Usage& usage = usage_[scope];
      if (usage.waiters < kMaxScopeWaiters) {
        ++usage.waiters;
        waiters_.push_back(Waiter{scope, std::move(keys), deadline, std::move(done)});
        return;
      }
    }
  }
  if (!values) {
    done(absl::ResourceExhaustedError(absl::StrCat("the rendezvous of ", scope, " has ",
                                                   kMaxScopeWaiters,
                                                   " waits parked, the most one job epoch may")));
    return;
  }
  done(*std::move(values));
}

void RendezvousStore::ExpireWaiters(absl::Time now) {
  std::vector<std::pair<WaitCallback, absl::Status>> expired;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (it->deadline > now) {
        ++it;
        continue;
      }
      std::vector<std::string> missing;
      auto sit = data_.find(it->scope);
      for (const std::string& key : it->keys) {
        if (sit == data_.end() || !sit->second.contains(key)) missing.push_back(key);
      }
      expired.emplace_back(std::move(it->done), absl::DeadlineExceededError(absl::StrCat(
                                                    "rendezvous wait timed out; keys not set: ",
                                                    absl::StrJoin(missing, ", "))));
      --usage_[it->scope].waiters;
      it = waiters_.erase(it);
    }
  }
  for (auto& [done, status] : expired) done(status);
}

void RendezvousStore::DropScope(const std::string& scope, const std::string& reason) {
  std::vector<WaitCallback> aborted;
  {
    absl::MutexLock lock(&mu_);
    data_.erase(scope);
    usage_.erase(scope);
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (it->scope != scope) {
        ++it;
        continue;
      }
      aborted.push_back(std::move(it->done));
      it = waiters_.erase(it);
    }
  }
  for (auto& done : aborted) done(absl::AbortedError(reason));
}

void RendezvousStore::AbortAll(const std::string& reason) {
  std::vector<Waiter> waiters;
  {
    absl::MutexLock lock(&mu_);
    waiters.swap(waiters_);
    for (auto& [scope, usage] : usage_) usage.waiters = 0;
  }
  for (Waiter& w : waiters) w.done(absl::UnavailableError(reason));
}

}  // namespace ringmaster
