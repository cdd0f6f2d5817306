#include "common/relay_plan.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"

namespace ringmaster {

std::vector<int32_t> PlanRelays(absl::Span<const std::string_view> host_of_rank,
                                int32_t hosts_per_relay) {
  hosts_per_relay = std::max<int32_t>(1, hosts_per_relay);
  const int32_t n = static_cast<int32_t>(host_of_rank.size());
  // Hosts numbered in the order of their lowest ranks; a group is hosts_per_relay of them.
  absl::flat_hash_map<std::string_view, int32_t> host_index;
  std::vector<int32_t> group(n);
  for (int32_t r = 0; r < n; ++r) {
    const int32_t index = host_index.try_emplace(host_of_rank[r], host_index.size()).first->second;
    group[r] = index / hosts_per_relay;
  }
  // A group's lowest rank relays for it, when the group has two ranks or more.
  std::vector<int32_t> lowest((host_index.size() + hosts_per_relay - 1) / hosts_per_relay, -1);
  std::vector<int32_t> members(lowest.size(), 0);
  for (int32_t r = 0; r < n; ++r) {
    if (lowest[group[r]] < 0) lowest[group[r]] = r;
    ++members[group[r]];
  }
  std::vector<int32_t> relay(n, -1);
  for (int32_t r = 0; r < n; ++r) {
    if (members[group[r]] >= 2) relay[r] = lowest[group[r]];
  }
  return relay;
}

}  // namespace ringmaster
