#include "coordinator/scheduler.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace ringmaster {
namespace {

// "cpu" before "cuda:0" before "cuda:2" before "cuda:10".
std::tuple<int, int, std::string> DeviceKey(const std::string& device) {
  int ordinal = 0;
  if (device.rfind("cuda:", 0) == 0 && absl::SimpleAtoi(device.substr(5), &ordinal)) {
    return {1, ordinal, device};
  }
  return {0, 0, device};
}

}  // namespace

std::vector<Worker> SlotsFor(const std::vector<Worker>& workers, Backend backend) {
  if (backend != Backend::kNccl) return workers;
  std::vector<Worker> gpus;
  for (const Worker& w : workers) {
    if (w.device != "cpu") gpus.push_back(w);
  }
  return gpus;
}

std::string WaitingReason(const std::vector<Worker>& workers, int np, int processes_per_host,
                          Backend backend) {
  std::vector<Worker> idle;
  int registered = 0, gpus = 0;
  for (const Worker& w : workers) {
    if (w.state == WorkerState::kLost) continue;
    ++registered;
    if (w.device != "cpu") ++gpus;
    if (w.state == WorkerState::kIdle && w.connected) idle.push_back(w);
  }
  idle = SlotsFor(idle, backend);
  if (GangSchedule(idle, np, processes_per_host).ok()) return "";
  // The slots the job's backend runs on; with AUTO, the kind the registered workers are.
  const char* kind = backend == Backend::kNccl   ? "gpu "
                     : backend == Backend::kGloo ? "cpu "
                     : gpus == 0                 ? "cpu "
                     : gpus == registered        ? "gpu "
                                                 : "";
  std::string reason = absl::StrCat("needs ", np, " idle ", kind, np == 1 ? "slot" : "slots");
  if (processes_per_host > 0)
    absl::StrAppend(&reason, " (at most ", processes_per_host, " per host)");
  absl::StrAppend(&reason, "; ", registered, " registered, ", idle.size(), " idle");
  if (static_cast<int>(idle.size()) >= np) {
    // Enough idle workers, but the per-host limit leaves too few of them usable.
    std::map<std::string, int> by_host;
    for (const Worker& w : idle) ++by_host[w.host];
    int usable = 0;
    for (const auto& [host, n] : by_host) usable += std::min(n, processes_per_host);
    absl::StrAppend(&reason, " on ", by_host.size(), by_host.size() == 1 ? " host" : " hosts", ", ",
                    usable, " usable with at most ", processes_per_host, " per host");
  }
  return reason;
}

namespace {

// Rank `rank` on worker `w` (its placement; the local and cross ranks are the caller's).
RankInfo RankOn(const Worker& w, int32_t rank) {
  RankInfo r;
  r.rank = rank;
  r.worker_id = w.id;
  r.host = w.host;
  r.device = w.device;
  r.address = w.address;
  r.worker_identity = w.identity;
  r.worker_secret_sha256 = w.secret_sha256;
  return r;
}

}  // namespace

absl::StatusOr<std::vector<RankInfo>> GangSchedule(const std::vector<Worker>& available, int np,
                                                   int processes_per_host) {
  std::map<std::string, std::vector<const Worker*>> by_host;
  for (const Worker& w : available) by_host[w.host].push_back(&w);
  const int cap = processes_per_host > 0 ? processes_per_host : np;

  // Fill the hosts with the most usable workers first (fewest hosts, fewest cross-host hops).
  std::vector<std::pair<std::string, int>> hosts;
  int usable = 0;
  for (auto& [host, workers] : by_host) {
    std::sort(workers.begin(), workers.end(), [](const Worker* a, const Worker* b) {
      return std::make_pair(DeviceKey(a->device), a->id) <
             std::make_pair(DeviceKey(b->device), b->id);
    });
    const int n = std::min<int>(cap, static_cast<int>(workers.size()));
    hosts.emplace_back(host, n);
    usable += n;
  }
  if (usable < np) {
    return absl::UnavailableError(absl::StrCat(
        "needs ", np, " idle workers",
        processes_per_host > 0 ? absl::StrCat(" with at most ", processes_per_host, " per host")
                               : "",
        "; ", usable, " usable of ", available.size(), " idle on ", by_host.size(), " hosts"));
  }
  std::stable_sort(hosts.begin(), hosts.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  std::map<std::string, int> take;  // chosen hosts in name order
  int remaining = np;
  for (const auto& [host, n] : hosts) {
    if (remaining == 0) break;
    take[host] = std::min(n, remaining);
    remaining -= take[host];
  }

  std::vector<RankInfo> ranks;
  ranks.reserve(np);
  for (const auto& [host, n] : take) {
    for (int local = 0; local < n; ++local) {
      RankInfo r = RankOn(*by_host[host][local], static_cast<int32_t>(ranks.size()));
      r.local_rank = local;
      r.local_size = n;
      ranks.push_back(std::move(r));
    }
  }
  // cross_rank: the host's index among hosts that have this local_rank; cross_size: how many do.
  for (RankInfo& r : ranks) {
    int index = 0, count = 0;
    for (const auto& [host, n] : take) {
      if (n <= r.local_rank) continue;
      if (host == r.host) index = count;
      ++count;
    }
    r.cross_rank = index;
    r.cross_size = count;
  }
  return ranks;
}

absl::StatusOr<std::vector<RankInfo>> PlaceClaimed(const std::vector<Worker>& claimed) {
  std::vector<RankInfo> ranks(claimed.size());
  std::map<std::string, int> holder;      // worker id -> its rank
  std::vector<std::string> hosts;         // by lowest rank
  std::map<std::string, int> local_size;  // host -> ranks on it
  for (size_t i = 0; i < claimed.size(); ++i) {
    const Worker& w = claimed[i];
    const int rank = static_cast<int>(i);
    if (auto [it, inserted] = holder.emplace(w.id, rank); !inserted) {
      return absl::InvalidArgumentError(absl::StrCat(
          "worker ", w.id, " on ", w.host, " claimed both rank ", it->second, " and rank ", rank));
    }
    RankInfo& r = ranks[i];
    r = RankOn(w, rank);
    r.local_rank = local_size[w.host]++;
    if (r.local_rank == 0) hosts.push_back(w.host);
  }
  for (RankInfo& r : ranks) {
    r.local_size = local_size[r.host];
    int index = 0, count = 0;
    for (const std::string& host : hosts) {
      if (local_size[host] <= r.local_rank) continue;
      if (host == r.host) index = count;
      ++count;
    }
    r.cross_rank = index;
    r.cross_size = count;
  }
  return ranks;
}

}  // namespace ringmaster
