// Who relays whose negotiation (the job knobs negotiation_relay and negotiation_relay_hosts), as
// the coordinator and every worker daemon work it out alike from the job's ranks and their hosts.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/types/span.h"

namespace ringmaster {

// The relay of each rank, by rank: the job's hosts, in the order of their lowest ranks, go in
// groups of `hosts_per_relay` (the last group may have fewer); the lowest rank of a group relays
// for every rank of the group, itself included. -1 for a rank that is alone in its group: it
// negotiates on its own session. `host_of_rank[r]` is rank r's host; `hosts_per_relay` < 1 counts
// as 1.
std::vector<int32_t> PlanRelays(absl::Span<const std::string_view> host_of_rank,
                                int32_t hosts_per_relay);

}  // namespace ringmaster
