#include "worker/rendezvous/net_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

namespace ringmaster {
namespace {

std::string Numeric(const sockaddr* sa) {
  char text[INET6_ADDRSTRLEN] = {};
  const void* raw =
      sa->sa_family == AF_INET
          ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(sa)->sin_addr)
          : static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr);
  if (inet_ntop(sa->sa_family, raw, text, sizeof(text)) == nullptr) return "";
  return text;
}

bool SameAddress(const sockaddr* a, const sockaddr* b) {
  if (a->sa_family != b->sa_family) return false;
  if (a->sa_family == AF_INET) {
    return std::memcmp(&reinterpret_cast<const sockaddr_in*>(a)->sin_addr,
                       &reinterpret_cast<const sockaddr_in*>(b)->sin_addr, sizeof(in_addr)) == 0;
  }
  return std::memcmp(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr,
                     &reinterpret_cast<const sockaddr_in6*>(b)->sin6_addr, sizeof(in6_addr)) == 0;
}

// The interface holding `local` ("" when none does, e.g. an address of another namespace).
std::string InterfaceHolding(const sockaddr* local) {
  ifaddrs* all = nullptr;
  if (getifaddrs(&all) != 0) return "";
  absl::Cleanup free_all = [all] { freeifaddrs(all); };
  for (const ifaddrs* i = all; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr != nullptr && SameAddress(i->ifa_addr, local)) return i->ifa_name;
  }
  return "";
}

}  // namespace

bool IsNumericAddress(absl::string_view text) {
  const std::string s(text);
  in6_addr scratch;
  return inet_pton(AF_INET, s.c_str(), &scratch) == 1 ||
         inet_pton(AF_INET6, s.c_str(), &scratch) == 1;
}

absl::StatusOr<LocalAddress> AddressTowards(absl::string_view target) {
  // A coordinator reached through a Unix socket is on this machine.
  if (absl::StartsWith(target, "unix:") || absl::StartsWith(target, "unix-abstract:")) {
    return LocalAddress{.address = "127.0.0.1", .iface = "lo"};
  }
  absl::string_view rest = target;
  absl::ConsumePrefix(&rest, "dns:///");
  absl::ConsumePrefix(&rest, "ipv4:");
  absl::ConsumePrefix(&rest, "ipv6:");
  std::string host, port;
  if (absl::ConsumePrefix(&rest, "[")) {
    const size_t close = rest.find("]:");
    if (close == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("coordinator address '", target, "' is not [IPV6]:PORT"));
    }
    host = std::string(rest.substr(0, close));
    port = std::string(rest.substr(close + 2));
  } else {
    const size_t colon = rest.rfind(':');
    if (colon == absl::string_view::npos || colon == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("coordinator address '", target, "' is not HOST:PORT"));
    }
    host = std::string(rest.substr(0, colon));
    port = std::string(rest.substr(colon + 1));
  }
  int port_number = 0;
  if (!absl::SimpleAtoi(port, &port_number) || port_number < 1 || port_number > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("coordinator address '", target, "': '", port, "' is not a port"));
  }
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("coordinator host '", host, "' does not resolve: ", gai_strerror(rc)));
  }
  absl::Cleanup free_found = [found] { freeaddrinfo(found); };
  std::string last_error = "no address";
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    absl::Cleanup close_fd = [fd] { close(fd); };
    // A datagram socket's connect only picks the route and the source address: nothing is sent.
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      last_error = absl::StrCat(Numeric(a->ai_addr), ": ", std::strerror(errno));
      continue;
    }
    sockaddr_storage local = {};
    socklen_t length = sizeof(local);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) != 0) {
      last_error = std::strerror(errno);
      continue;
    }
    const sockaddr* l = reinterpret_cast<const sockaddr*>(&local);
    return LocalAddress{Numeric(l), InterfaceHolding(l)};
  }
  return absl::UnavailableError(
      absl::StrCat("no route to the coordinator at ", target, ": ", last_error));
}

absl::StatusOr<LocalAddress> AddressOfInterface(absl::string_view iface) {
  ifaddrs* all = nullptr;
  if (getifaddrs(&all) != 0) {
    return absl::UnavailableError(absl::StrCat("getifaddrs: ", std::strerror(errno)));
  }
  absl::Cleanup free_all = [all] { freeifaddrs(all); };
  std::string v6;
  std::set<std::string> names;
  for (const ifaddrs* i = all; i != nullptr; i = i->ifa_next) {
    names.insert(i->ifa_name);
    if (i->ifa_addr == nullptr || iface != i->ifa_name) continue;
    if (i->ifa_addr->sa_family == AF_INET) return LocalAddress{Numeric(i->ifa_addr), i->ifa_name};
    if (i->ifa_addr->sa_family == AF_INET6 && v6.empty()) v6 = Numeric(i->ifa_addr);
  }
  if (!v6.empty()) return LocalAddress{v6, std::string(iface)};
  return absl::NotFoundError(
      absl::StrCat("network interface '", iface,
                   "' has no address here; interfaces: ", absl::StrJoin(names, ", ")));
}

}  // namespace ringmaster
