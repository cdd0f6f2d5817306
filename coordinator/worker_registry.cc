#include "coordinator/worker_registry.h"

#include <arpa/inet.h>

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/secret.h"

namespace ringmaster {
namespace {

bool IsNumericAddress(const std::string& text) {
  unsigned char scratch[sizeof(in6_addr)];
  return inet_pton(AF_INET, text.c_str(), scratch) == 1 ||
         inet_pton(AF_INET6, text.c_str(), scratch) == 1;
}

}  // namespace

absl::string_view WorkerStateName(WorkerState state) {
  switch (state) {
    case WorkerState::kIdle:
      return "IDLE";
    case WorkerState::kBusy:
      return "BUSY";
    case WorkerState::kLost:
      return "LOST";
  }
  return "UNSPECIFIED";
}

absl::Status ValidateWorkerPlacement(const std::string& host, const std::string& device) {
  if (host.empty() || host.size() > 253) {
    return absl::InvalidArgumentError(absl::StrCat("host must be 1..253 bytes; got ", host.size()));
  }
  for (char c : host) {
    if (!absl::ascii_isalnum(c) && c != '.' && c != '-' && c != '_') {
      return absl::InvalidArgumentError(
          absl::StrCat("host '", host, "' may contain only letters, digits, '.', '-' and '_'"));
    }
  }
  int ordinal = -1;
  const bool ok = device == "cpu" ||
                  (absl::StartsWith(device, "cuda:") &&
                   absl::SimpleAtoi(device.substr(5), &ordinal) && ordinal >= 0 && ordinal < 1024);
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("device '", device, "' is not \"cpu\" or \"cuda:N\" (0 <= N < 1024)"));
  }
  return absl::OkStatus();
}

WorkerRegistry::WorkerRegistry(Clock* clock, absl::Duration lease, absl::Duration reconnect_grace)
    : clock_(clock), lease_(lease), reconnect_grace_(reconnect_grace) {}

absl::StatusOr<Worker> WorkerRegistry::Register(std::string host, std::string device,
                                                std::map<std::string, std::string> labels,
                                                uint64_t incarnation, std::string address,
                                                std::string identity, std::string slot) {
  if (slot.size() > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("slot must be at most 256 bytes; got ", slot.size()));
  }
  if (absl::Status s = ValidateWorkerPlacement(host, device); !s.ok()) return s;
  if (!address.empty() && (address.size() > 45 || address.find('\0') != std::string::npos ||
                           !IsNumericAddress(address))) {
    return absl::InvalidArgumentError(absl::StrCat("address '",
                                                   absl::CHexEscape(address.substr(0, 64)),
                                                   "' is not a numeric IPv4 or IPv6 address"));
  }
  if (labels.size() > 64) return absl::InvalidArgumentError("labels has more than 64 entries");
  for (const auto& [key, value] : labels) {
    if (key.empty() || key.size() > 63) {
      return absl::InvalidArgumentError(absl::StrCat("labels key '",
                                                     absl::CHexEscape(key.substr(0, 64)),
                                                     "' must be 1..63 bytes; got ", key.size()));
    }
    if (value.size() > 256) {
      return absl::InvalidArgumentError(absl::StrCat(
          "labels['", absl::CHexEscape(key), "'] must be at most 256 bytes; got ", value.size()));
    }
  }
  absl::MutexLock lock(&mu_);
  Worker w;
  w.id = absl::StrFormat("worker-%06d", next_id_++);
  w.host = std::move(host);
  w.device = std::move(device);
  w.address = std::move(address);
  w.labels = std::move(labels);
  w.last_heartbeat = clock_->Now();
  w.incarnation = incarnation;
  w.identity = std::move(identity);
  w.slot = std::move(slot);
  const std::string secret = RandomSecret();
  w.secret_sha256 = Sha256Hex(secret);
  if (!w.slot.empty()) {
    for (auto& [id, old] : workers_) {
      // Only one whose session is gone: a daemon that died has lost its connection by the time
      // it registers again, while a live one must not be knocked out by whoever claims its
      // host and slot (many daemons may share one certificate).
      if (old.state != WorkerState::kLost && old.replaced_by.empty() && !old.connected &&
          old.identity == w.identity && old.host == w.host && old.slot == w.slot) {
        old.replaced_by = w.id;
      }
    }
  }
  workers_[w.id] = w;
  w.secret = secret;
  return w;
}

absl::Status WorkerRegistry::CheckSessionProof(const std::string& id, const std::string& identity,
                                               const std::string& secret) {
  absl::MutexLock lock(&mu_);
  auto w = FindLocked(id);
  if (!w.ok()) return w.status();
  if ((*w)->identity != identity) {
    return absl::PermissionDeniedError(absl::StrCat(
        "worker_id '", id, "' was registered by ",
        (*w)->identity.empty() ? std::string("no identity")
                               : absl::StrCat("'", (*w)->identity, "'"),
        "; ",
        identity.empty() ? std::string("a caller without one") : absl::StrCat("'", identity, "'"),
        " may not open its session"));
  }
  if ((*w)->secret_sha256.empty()) return absl::OkStatus();  // restored from an older record
  if (!ConstantTimeEquals(Sha256Hex(secret), (*w)->secret_sha256)) {
    return absl::UnauthenticatedError(
        absl::StrCat("the session secret for worker_id '", id,
                     "' is not the one its registration issued: register again"));
  }
  return absl::OkStatus();
}

absl::Status WorkerRegistry::CheckIncarnation(const std::string& id, uint64_t incarnation) {
  absl::MutexLock lock(&mu_);
  auto w = FindLocked(id);
  if (!w.ok()) return w.status();
  if ((*w)->incarnation == 0) {
    (*w)->incarnation = incarnation;
  } else if (incarnation != 0 && incarnation != (*w)->incarnation) {
    return absl::NotFoundError(
        absl::StrCat("worker_id '", id, "' belongs to another daemon now; register again"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Worker*> WorkerRegistry::FindLocked(const std::string& id) {
  auto it = workers_.find(id);
  if (it == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("worker_id '", id, "' is not registered"));
  }
  if (it->second.state == WorkerState::kLost) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", id, " on ", it->second.host, " lost its lease; register again"));
  }
  return &it->second;
}

absl::StatusOr<Worker> WorkerRegistry::Get(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto w = const_cast<WorkerRegistry*>(this)->FindLocked(id);
  if (!w.ok()) return w.status();
  return **w;
}

absl::Status WorkerRegistry::Heartbeat(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto w = FindLocked(id);
  if (!w.ok()) return w.status();
  (*w)->last_heartbeat = clock_->Now();
  return absl::OkStatus();
}

absl::Status WorkerRegistry::SetConnected(const std::string& id, bool connected) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(id);
  if (it == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("worker_id '", id, "' is not registered"));
  }
  Worker& w = it->second;
  if (connected) {
    w.last_heartbeat = clock_->Now();
    w.disconnected_since = absl::InfiniteFuture();
    w.restored_until = absl::InfinitePast();
  } else if (w.connected) {
    w.disconnected_since = clock_->Now();
  }
  w.connected = connected;
  return absl::OkStatus();
}

std::vector<Worker> WorkerRegistry::Available() const {
  absl::MutexLock lock(&mu_);
  std::vector<Worker> out;
  for (const auto& [id, w] : workers_) {
    if (w.state == WorkerState::kIdle && w.connected) out.push_back(w);
  }
  return out;
}

std::vector<Worker> WorkerRegistry::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<Worker> out;
  for (const auto& [id, w] : workers_) out.push_back(w);
  return out;
}

absl::Status WorkerRegistry::Assign(const std::vector<std::string>& ids, const std::string& job_id,
                                    const std::vector<int32_t>& ranks) {
  absl::MutexLock lock(&mu_);
  for (const std::string& id : ids) {
    auto w = FindLocked(id);
    if (!w.ok()) return w.status();
    if ((*w)->state != WorkerState::kIdle || !(*w)->connected) {
      return absl::FailedPreconditionError(absl::StrCat("worker ", id, " is not idle"));
    }
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    Worker& w = workers_.at(ids[i]);
    w.state = WorkerState::kBusy;
    w.job_id = job_id;
    w.rank = ranks[i];
  }
  return absl::OkStatus();
}

void WorkerRegistry::Release(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(id);
  if (it == workers_.end() || it->second.state != WorkerState::kBusy) return;
  it->second.state = WorkerState::kIdle;
  it->second.job_id.clear();
  it->second.rank = -1;
}

absl::Status WorkerRegistry::Renumber(const std::string& id, const std::string& job_id,
                                      int32_t rank) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(id);
  if (it == workers_.end() || it->second.state != WorkerState::kBusy ||
      it->second.job_id != job_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", id, " does not serve job ", job_id));
  }
  it->second.rank = rank;
  return absl::OkStatus();
}

absl::Status WorkerRegistry::Restore(const std::string& id, std::string host, std::string device,
                                     const std::string& job_id, int32_t rank, absl::Time until,
                                     std::string address, std::string identity,
                                     std::string secret_sha256) {
  absl::MutexLock lock(&mu_);
  if (workers_.contains(id)) {
    return absl::FailedPreconditionError(absl::StrCat("worker ", id, " is known already"));
  }
  Worker w;
  w.id = id;
  w.host = std::move(host);
  w.device = std::move(device);
  w.address = std::move(address);
  w.state = WorkerState::kBusy;
  w.job_id = job_id;
  w.rank = rank;
  w.last_heartbeat = clock_->Now();
  w.disconnected_since = clock_->Now();
  w.restored_until = until;
  w.identity = std::move(identity);
  w.secret_sha256 = std::move(secret_sha256);
  workers_[id] = std::move(w);
  return absl::OkStatus();
}

void WorkerRegistry::ReserveId(const std::string& id) {
  int64_t number = 0;
  if (!absl::StartsWith(id, "worker-") || !absl::SimpleAtoi(id.substr(7), &number)) return;
  absl::MutexLock lock(&mu_);
  next_id_ = std::max(next_id_, number + 1);
}

void WorkerRegistry::RenewLeases() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  for (auto& [id, w] : workers_) {
    if (w.state == WorkerState::kLost) continue;
    w.last_heartbeat = std::max(w.last_heartbeat, now);
    if (!w.connected) w.disconnected_since = std::max(w.disconnected_since, now);
    if (w.restored_until != absl::InfinitePast()) {
      w.restored_until = std::max(w.restored_until, now + reconnect_grace_);
    }
  }
}

std::vector<Worker> WorkerRegistry::ExpireLeases() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  std::vector<Worker> lost;
  for (auto it = workers_.begin(); it != workers_.end();) {
    Worker& w = it->second;
    if (!w.replaced_by.empty()) {
      // Its row goes: the new registration is the same daemon's slot.
      w.lost_reason =
          absl::StrCat(w.identity.empty() ? "" : absl::StrCat("its identity '", w.identity, "' "),
                       "registered ", w.host, " ", w.slot, " again, as ", w.replaced_by,
                       " (its daemon restarted or registered anew)");
      if (w.state != WorkerState::kLost) {
        w.state = WorkerState::kLost;
        w.connected = false;
        lost.push_back(w);
      }
      it = workers_.erase(it);
      continue;
    }
    ++it;
    if (w.state == WorkerState::kLost) continue;
    if (!w.connected && now < w.restored_until) {
      continue;  // its daemon is still reattaching
    } else if (!w.connected && w.restored_until != absl::InfinitePast()) {
      w.lost_reason = "it did not reconnect after the coordinator restarted";
    } else if (now - w.last_heartbeat >= lease_) {
      w.lost_reason = absl::StrCat("no heartbeat for ", absl::FormatDuration(lease_));
    } else if (w.state == WorkerState::kBusy && !w.connected &&
               now - w.disconnected_since >= reconnect_grace_) {
      w.lost_reason = absl::StrCat("its session broke and it did not reconnect within ",
                                   absl::FormatDuration(reconnect_grace_));
    } else {
      continue;
    }
    lost.push_back(w);
    w.state = WorkerState::kLost;
    w.connected = false;
  }
  return lost;
}

}  // namespace ringmaster
