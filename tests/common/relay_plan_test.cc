#include "common/relay_plan.h"

#include <string_view>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster {
namespace {

using ::testing::ElementsAre;

TEST(PlanRelaysTest, OneRelayPerHostIsTheHostsLowestRank) {
  // Ranks placed round-robin over two hosts, and a third host with one rank.
  std::vector<std::string_view> hosts = {"a", "b", "a", "b", "c"};
  EXPECT_THAT(PlanRelays(hosts, 1), ElementsAre(0, 1, 0, 1, -1));
  EXPECT_THAT(PlanRelays(hosts, 0), ElementsAre(0, 1, 0, 1, -1));  // 0 counts as 1
}

TEST(PlanRelaysTest, HostsGoInGroupsInTheOrderOfTheirLowestRanks) {
  // Hosts in order of first rank: b (rank 0), a (rank 1), d (rank 3), c (rank 5), e (rank 6).
  std::vector<std::string_view> hosts = {"b", "a", "b", "d", "a", "c", "e", "d"};
  // Groups of two hosts: {b, a} relayed by rank 0, {d, c} by rank 3, {e} alone.
  EXPECT_THAT(PlanRelays(hosts, 2), ElementsAre(0, 0, 0, 3, 0, 3, -1, 3));
  // Groups of three: {b, a, d} by rank 0, {c, e} by rank 5.
  EXPECT_THAT(PlanRelays(hosts, 3), ElementsAre(0, 0, 0, 0, 0, 5, 5, 0));
  // One group for all.
  EXPECT_THAT(PlanRelays(hosts, 64), ElementsAre(0, 0, 0, 0, 0, 0, 0, 0));
}

TEST(PlanRelaysTest, ARankAloneInItsGroupHasNoRelay) {
  std::vector<std::string_view> hosts = {"a", "b", "c"};
  EXPECT_THAT(PlanRelays(hosts, 1), ElementsAre(-1, -1, -1));
  EXPECT_THAT(PlanRelays(hosts, 2), ElementsAre(0, 0, -1));
  EXPECT_THAT(PlanRelays({}, 2), ElementsAre());
}

}  // namespace
}  // namespace ringmaster
