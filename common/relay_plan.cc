#include "common/relay_plan.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"

namespace ringmaster {

std::vector<int32_t> PlanRelays(absl::Span<const RelayMember> ranks, int32_t hosts_per_relay) {
  hosts_per_relay = std::max<int32_t>(1, hosts_per_relay);
  const int32_t n = static_cast<int32_t>(ranks.size());
  // Each host (a host name with one identity) joins its identity's current group, in the order
  // of the hosts' lowest ranks; a group is numbered when its first host comes.
  absl::flat_hash_map<std::pair<std::string_view, std::string_view>, int32_t> group_of_host;
  absl::flat_hash_map<std::pair<std::string_view, int32_t>, int32_t> group_of_number;
  absl::flat_hash_map<std::string_view, int32_t> hosts_of_identity;
  std::vector<int32_t> group(n);
  for (int32_t r = 0; r < n; ++r) {
    const RelayMember& m = ranks[r];
    auto [host, fresh] = group_of_host.try_emplace({m.identity, m.host}, 0);
    if (fresh) {
      const int32_t number = hosts_of_identity[m.identity]++ / hosts_per_relay;
      const int32_t next = static_cast<int32_t>(group_of_number.size());
      host->second = group_of_number.try_emplace({m.identity, number}, next).first->second;
    }
    group[r] = host->second;
  }
  // A group's lowest rank relays for it, when the group has two ranks or more.
  std::vector<int32_t> lowest(group_of_number.size(), -1);
  std::vector<int32_t> members(group_of_number.size(), 0);
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
