#include "worker/rendezvous/net_address.h"

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace ringmaster {
namespace {

TEST(NetAddressTest, TheRouteToALoopbackCoordinatorIsLoopback) {
  for (const char* target : {"127.0.0.1:50051", "dns:///127.0.0.1:50051", "ipv4:127.0.0.1:9"}) {
    absl::StatusOr<LocalAddress> a = AddressTowards(target);
    ASSERT_TRUE(a.ok()) << target << ": " << a.status();
    EXPECT_EQ(a->address, "127.0.0.1") << target;
    EXPECT_EQ(a->iface, "lo") << target;
  }
}

TEST(NetAddressTest, ACoordinatorOnAUnixSocketIsOnThisMachine) {
  for (const char* target : {"unix:/tmp/ringmaster-1-coordinator.sock", "unix-abstract:rm"}) {
    absl::StatusOr<LocalAddress> a = AddressTowards(target);
    ASSERT_TRUE(a.ok()) << target << ": " << a.status();
    EXPECT_EQ(a->address, "127.0.0.1") << target;
    EXPECT_EQ(a->iface, "lo") << target;
  }
}

TEST(NetAddressTest, ABadTargetNamesItself) {
  absl::StatusOr<LocalAddress> a = AddressTowards("coordinator");
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a.status().message(), "coordinator address 'coordinator' is not HOST:PORT");
  a = AddressTowards("coordinator:http");
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a.status().message(), "coordinator address 'coordinator:http': 'http' is not a port");
  a = AddressTowards("[::1:50051");
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(NetAddressTest, AnInterfaceGivesItsAddressOrNamesThoseThereAre) {
  absl::StatusOr<LocalAddress> lo = AddressOfInterface("lo");
  ASSERT_TRUE(lo.ok()) << lo.status();
  EXPECT_EQ(lo->address, "127.0.0.1");
  EXPECT_EQ(lo->iface, "lo");
  absl::StatusOr<LocalAddress> none = AddressOfInterface("nosuch0");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StartsWith(none.status().message(),
                               "network interface 'nosuch0' has no address here; interfaces: "))
      << none.status();
  EXPECT_TRUE(absl::StrContains(none.status().message(), "lo")) << none.status();
}

TEST(NetAddressTest, NumericAddressesAreRecognised) {
  EXPECT_TRUE(IsNumericAddress("10.0.0.1"));
  EXPECT_TRUE(IsNumericAddress("fd00::7"));
  EXPECT_FALSE(IsNumericAddress("node-1"));
  EXPECT_FALSE(IsNumericAddress("10.0.0.1:80"));
  EXPECT_FALSE(IsNumericAddress(""));
}

}  // namespace
}  // namespace ringmaster
