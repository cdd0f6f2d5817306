// Who relays whose negotiation (the job knobs negotiation_relay and negotiation_relay_hosts), as
// the coordinator and every worker daemon work it out alike from the job's ranks, their hosts and
// their workers' identities.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/types/span.h"

namespace ringmaster {

// One rank of the job, as the plan sees it.
struct RelayMember {
  std::string_view host;
  // The identity that registered the rank's worker (its certificate's CN; empty without
  // authentication). The coordinator takes a relay's batches only for ranks of its own identity.
  std::string_view identity;
};

// The relay of each rank, by rank (`ranks[r]` is rank r). A host here is a host name with one
// identity. The hosts of each identity, in the order of their lowest ranks, go in groups of
// `hosts_per_relay` (the last group of an identity may have fewer); the lowest rank of a group
// relays for every rank of the group, itself included. -1 for a rank that is alone in its group:
// it negotiates on its own session. `hosts_per_relay` < 1 counts as 1.
std::vector<int32_t> PlanRelays(absl::Span<const RelayMember> ranks, int32_t hosts_per_relay);

}  // namespace ringmaster
