// What a worker's "who is slow" figures cost (worker/execution_clocks.h): the engine's Executed()
// per response, a communicator call's NetworkEnter/NetworkLeave, and the reporter's Read() of
// `connections` real TCP connections (loopback, 127.0.0.2 to 127.0.0.1, as from another host),
// twice a second. Prints one JSON object; docs/benchmarks.md turns it into the share of a step.
//
//     build/bin/ringmaster-execution-clocks-bench [--connections 2,64,1023]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "worker/execution_clocks.h"

ABSL_FLAG(std::string, connections, "2,64,1023", "connections Read() goes over, comma-separated");

namespace ringmaster {
namespace {

// `n` connected TCP pairs from 127.0.0.2 to 127.0.0.1; all descriptors in `fds`.
bool Connect(int n, std::vector<int>* fds) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(listener, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(listener, 4096) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return false;
  }
  for (int i = 0; i < n; ++i) {
    const int a = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in from{};
    from.sin_family = AF_INET;
    from.sin_addr.s_addr = htonl(INADDR_LOOPBACK + 1);
    if (bind(a, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0 ||
        connect(a, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
      return false;
    }
    const int b = accept(listener, nullptr, nullptr);
    if (b < 0) return false;
    fds->push_back(a);
    fds->push_back(b);
  }
  close(listener);
  return true;
}

double NanosPer(int64_t calls, absl::Duration took) {
  return absl::ToDoubleNanoseconds(took) / static_cast<double>(calls);
}

int Run() {
  ExecutionClocks clocks;
  constexpr int64_t kCalls = 2'000'000;
  absl::Time start = absl::Now();
  for (int64_t i = 0; i < kCalls; ++i) clocks.Executed(absl::Microseconds(1));
  const double executed_ns = NanosPer(kCalls, absl::Now() - start);
  start = absl::Now();
  for (int64_t i = 0; i < kCalls; ++i) {
    clocks.NetworkEnter();
    clocks.NetworkLeave();
  }
  const double network_ns = NanosPer(kCalls, absl::Now() - start);
  std::vector<std::string> reads;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_connections), ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(part, &n) || n < 1) {
      std::fprintf(stderr, "--connections: '%s' is not a positive number\n",
                   std::string(part).c_str());
      return 2;
    }
    ExecutionClocks c;
    const ExecutionClocks::Sockets before = ExecutionClocks::TcpSockets();
    std::vector<int> fds;
    if (!Connect(n, &fds)) {
      std::fprintf(stderr, "could not connect %d pairs (raise ulimit -n)\n", n);
      return 1;
    }
    start = absl::Now();
    c.Adopt(before);
    const double adopt_us = absl::ToDoubleMicroseconds(absl::Now() - start);
    constexpr int kReads = 200;
    start = absl::Now();
    size_t read = 0;
    for (int i = 0; i < kReads; ++i) read = c.Read().connections;
    const double read_us = absl::ToDoubleMicroseconds(absl::Now() - start) / kReads;
    reads.push_back(absl::StrCat(R"({"connections": )", read, R"(, "adopt_us": )", adopt_us,
                                 R"(, "read_us": )", read_us, "}"));
    for (int fd : fds) close(fd);
  }
  std::printf(R"({"executed_ns": %.1f, "network_enter_leave_ns": %.1f, "reads": [%s]})"
              "\n",
              executed_ns, network_ns, absl::StrJoin(reads, ", ").c_str());
  return 0;
}

}  // namespace
}  // namespace ringmaster

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ringmaster::Run();
}
