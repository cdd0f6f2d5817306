#include "common/relay_plan.h"

#include <string_view>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster {
namespace {

using ::testing::ElementsAre;

// Ranks on `hosts`, all of one identity.
std::vector<RelayMember> OnHosts(std::vector<std::string_view> hosts) {
  std::vector<RelayMember> out;
  for (std::string_view h : hosts) out.push_back({h, "worker"});
  return out;
}

TEST(PlanRelaysTest, OneRelayPerHostIsTheHostsLowestRank) {
  // Ranks placed round-robin over two hosts, and a third host with one rank.
  const std::vector<RelayMember> ranks = OnHosts({"a", "b", "a", "b", "c"});
  EXPECT_THAT(PlanRelays(ranks, 1), ElementsAre(0, 1, 0, 1, -1));
  EXPECT_THAT(PlanRelays(ranks, 0), ElementsAre(0, 1, 0, 1, -1));  // 0 counts as 1
}

TEST(PlanRelaysTest, HostsGoInGroupsInTheOrderOfTheirLowestRanks) {
  // Hosts in order of first rank: b (rank 0), a (rank 1), d (rank 3), c (rank 5), e (rank 6).
  const std::vector<RelayMember> ranks = OnHosts({"b", "a", "b", "d", "a", "c", "e", "d"});
  // Groups of two hosts: {b, a} relayed by rank 0, {d, c} by rank 3, {e} alone.
  EXPECT_THAT(PlanRelays(ranks, 2), ElementsAre(0, 0, 0, 3, 0, 3, -1, 3));
  // Groups of three: {b, a, d} by rank 0, {c, e} by rank 5.
  EXPECT_THAT(PlanRelays(ranks, 3), ElementsAre(0, 0, 0, 0, 0, 5, 5, 0));
  // One group for all.
  EXPECT_THAT(PlanRelays(ranks, 64), ElementsAre(0, 0, 0, 0, 0, 0, 0, 0));
}

TEST(PlanRelaysTest, ARankAloneInItsGroupHasNoRelay) {
  EXPECT_THAT(PlanRelays(OnHosts({"a", "b", "c"}), 1), ElementsAre(-1, -1, -1));
  EXPECT_THAT(PlanRelays(OnHosts({"a", "b", "c"}), 2), ElementsAre(0, 0, -1));
  EXPECT_THAT(PlanRelays({}, 2), ElementsAre());
}

TEST(PlanRelaysTest, HostsOfAnotherIdentityGoInGroupsOfTheirOwn) {
  // A certificate per host (identities node-a, node-b, ...): every group is one host, whatever
  // the knob, since the coordinator takes a relay's batches only for ranks of its identity.
  std::vector<RelayMember> per_host = {
      {"a", "node-a"}, {"b", "node-b"}, {"a", "node-a"}, {"b", "node-b"}};
  EXPECT_THAT(PlanRelays(per_host, 2), ElementsAre(0, 1, 0, 1));
  // Two identities over four hosts: x's hosts a, c group together, y's b, d likewise.
  std::vector<RelayMember> mixed = {{"a", "x"}, {"b", "y"}, {"c", "x"}, {"d", "y"},
                                    {"a", "x"}, {"b", "y"}, {"c", "x"}, {"d", "y"}};
  EXPECT_THAT(PlanRelays(mixed, 2), ElementsAre(0, 1, 0, 1, 0, 1, 0, 1));
  // A host whose daemons registered under two identities is two hosts here.
  std::vector<RelayMember> split = {{"a", "x"}, {"a", "y"}, {"a", "x"}, {"a", "y"}};
  EXPECT_THAT(PlanRelays(split, 1), ElementsAre(0, 1, 0, 1));
}

}  // namespace
}  // namespace ringmaster
