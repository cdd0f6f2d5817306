// Which local address a daemon's data plane (Gloo's pairs, NCCL's socket bootstrap) uses, and which
// network interface holds it. By default the address the kernel would use to reach the coordinator:
// on a cluster that is the address on the network the hosts share, on one machine 127.0.0.1.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ringmaster {

struct LocalAddress {
  std::string address;  // numeric, e.g. "10.0.3.7" or "fd00::7"
  std::string iface;    // the interface that holds it, e.g. "eth0", "lo"
};

// The local address of a route to `target` ("host:port", "[v6]:port", optionally "dns:///" first),
// found without sending anything (a UDP socket connected to it). A Unix socket's target
// ("unix:PATH", "unix-abstract:NAME") is this machine: 127.0.0.1 on lo. UNAVAILABLE naming the
// target when its host does not resolve or no route leads there; INVALID_ARGUMENT for a target
// without a port.
absl::StatusOr<LocalAddress> AddressTowards(absl::string_view target);

// The first IPv4 address of interface `iface` (else its first IPv6 one). NOT_FOUND naming the
// interface and those there are when it has no address.
absl::StatusOr<LocalAddress> AddressOfInterface(absl::string_view iface);

// Whether `text` is a numeric IPv4 or IPv6 address.
bool IsNumericAddress(absl::string_view text);

}  // namespace ringmaster
