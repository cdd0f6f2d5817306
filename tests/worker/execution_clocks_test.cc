#include "worker/execution_clocks.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace ringmaster {
namespace {

// A connected pair of TCP sockets on loopback: from 127.0.0.2 (`from_second`, as from another
// host) or 127.0.0.1 (this host to itself) to 127.0.0.1.
struct Pair {
  int a = -1, b = -1;
  explicit Pair(bool from_second = true) {
    const int listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    EXPECT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), len), 0);
    EXPECT_EQ(listen(listener, 1), 0);
    EXPECT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    a = socket(AF_INET, SOCK_STREAM, 0);
    if (from_second) {
      sockaddr_in from{};
      from.sin_family = AF_INET;
      from.sin_addr.s_addr = htonl(INADDR_LOOPBACK + 1);
      EXPECT_EQ(bind(a, reinterpret_cast<sockaddr*>(&from), sizeof(from)), 0);
    }
    EXPECT_EQ(connect(a, reinterpret_cast<sockaddr*>(&addr), len), 0);
    b = accept(listener, nullptr, nullptr);
    close(listener);
  }
  ~Pair() {
    close(a);
    close(b);
  }
};

void SendAll(int fd, size_t bytes) {
  std::vector<char> data(64 << 10, 'x');
  while (bytes > 0) {
    const ssize_t n = send(fd, data.data(), std::min(bytes, data.size()), 0);
    ASSERT_GT(n, 0);
    bytes -= static_cast<size_t>(n);
  }
}

void ReceiveAll(int fd, size_t bytes) {
  std::vector<char> data(64 << 10);
  while (bytes > 0) {
    const ssize_t n = recv(fd, data.data(), std::min(bytes, data.size()), 0);
    ASSERT_GT(n, 0);
    bytes -= static_cast<size_t>(n);
  }
}

TEST(ExecutionClocksTest, CountsTheBytesSentOnTheConnectionsAdoptedAndNoOthers) {
  Pair before;  // a connection that was there before the communicator: not its link
  const ExecutionClocks::Sockets sockets = ExecutionClocks::TcpSockets();
  EXPECT_TRUE(sockets.size() >= 2);
  ExecutionClocks clocks;
  Pair link;
  Pair itself(/*from_second=*/false);  // this host to itself: not a link
  clocks.Adopt(sockets);
  EXPECT_EQ(clocks.Read().connections, 2u);  // both ends of `link` are this process's

  constexpr size_t kBytes = 3 << 20;
  std::thread reader([&] { ReceiveAll(link.b, kBytes); });
  std::thread other([&] { ReceiveAll(before.b, kBytes); });
  SendAll(link.a, kBytes);
  SendAll(before.a, kBytes);
  reader.join();
  other.join();
  // The peer acknowledges what it received (at once on loopback; allow for a delayed ack).
  ExecutionClocks::Totals t;
  for (absl::Time deadline = absl::Now() + absl::Seconds(5); absl::Now() < deadline;
       absl::SleepFor(absl::Milliseconds(10))) {
    t = clocks.Read();
    if (t.link_bytes_sent >= static_cast<int64_t>(kBytes)) break;
  }
  EXPECT_EQ(t.link_bytes_sent, static_cast<int64_t>(kBytes));
  EXPECT_GE(t.link_busy_ns, 0);  // in jiffies: a transfer this short may count none
  // What it sent since the last read: nothing, so no rate sample is of now.
  EXPECT_EQ(clocks.Read().link_delivery_rate, 0);
  std::thread again([&] { ReceiveAll(link.b, kBytes); });
  SendAll(link.a, kBytes);
  again.join();
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_GT(clocks.Read().link_delivery_rate, 0);
}

TEST(ExecutionClocksTest, AClosedConnectionIsDroppedAndItsBytesStayCounted) {
  const ExecutionClocks::Sockets sockets = ExecutionClocks::TcpSockets();
  ExecutionClocks clocks;
  auto link = std::make_unique<Pair>();
  clocks.Adopt(sockets);
  std::thread reader([&] { ReceiveAll(link->b, 1 << 20); });
  SendAll(link->a, 1 << 20);
  reader.join();
  ExecutionClocks::Totals t;
  for (absl::Time deadline = absl::Now() + absl::Seconds(5); absl::Now() < deadline;
       absl::SleepFor(absl::Milliseconds(10))) {
    t = clocks.Read();
    if (t.link_bytes_sent >= (1 << 20)) break;
  }
  ASSERT_EQ(t.link_bytes_sent, 1 << 20);
  link.reset();
  Pair reused;  // may take the closed connection's descriptors: not adopted
  t = clocks.Read();
  EXPECT_EQ(t.connections, 0u);
  EXPECT_EQ(t.link_bytes_sent, 1 << 20);
}

TEST(ExecutionClocksTest, NetworkTimeIsTheUnionOfOverlappingCalls) {
  ExecutionClocks clocks;
  // Two calls of 100 ms that overlap count the time either ran: at least 100 ms, at most the wall
  // time around both, and less than the two calls' sum.
  absl::Notification both;
  absl::Duration first_call, second_call;
  const absl::Time began = absl::Now();
  std::thread second([&] {
    const absl::Time at = absl::Now();
    clocks.NetworkEnter();
    both.Notify();
    absl::SleepFor(absl::Milliseconds(100));
    clocks.NetworkLeave();
    second_call = absl::Now() - at;
  });
  both.WaitForNotification();
  const absl::Time at = absl::Now();
  clocks.NetworkEnter();
  absl::SleepFor(absl::Milliseconds(100));
  clocks.NetworkLeave();
  first_call = absl::Now() - at;
  second.join();
  const absl::Duration wall = absl::Now() - began;
  const ExecutionClocks::Totals t = clocks.Read();
  EXPECT_GE(t.network_ns, 100'000'000);
  EXPECT_LE(t.network_ns, absl::ToInt64Nanoseconds(wall));
  EXPECT_LT(t.network_ns, absl::ToInt64Nanoseconds(first_call + second_call));
  clocks.Executed(absl::Milliseconds(250));
  clocks.Executed(absl::Milliseconds(50));
  const ExecutionClocks::Totals u = clocks.Read();
  EXPECT_EQ(u.collectives, 2);
  EXPECT_EQ(u.collective_ns, 300'000'000);
  EXPECT_EQ(u.network_ns, t.network_ns);
  EXPECT_GT(u.elapsed_ns, t.elapsed_ns);
}

TEST(ExecutionClocksTest, TheReporterSendsOnlyWhenCollectivesRan) {
  auto clocks = std::make_shared<ExecutionClocks>();
  absl::Mutex mu;
  std::vector<ExecutionClocks::Totals> sent;
  MetricsRegistry registry;
  const Labels labels = {{"job", "j"}, {"rank", "0"}, {"host", "h"}};
  {
    ExecutionReporter reporter(
        clocks,
        [&](const ExecutionClocks::Totals& t) {
          absl::MutexLock lock(&mu);
          sent.push_back(t);
        },
        absl::Milliseconds(20), &registry, labels);
    absl::SleepFor(absl::Milliseconds(100));  // idle: nothing sent
    {
      absl::MutexLock lock(&mu);
      EXPECT_TRUE(sent.empty());
    }
    clocks->Executed(absl::Milliseconds(30));
    auto sent_one = [&] {
      absl::MutexLock lock(&mu);
      return !sent.empty();
    };
    for (absl::Time deadline = absl::Now() + absl::Seconds(10);
         !sent_one() && absl::Now() < deadline;) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    absl::SleepFor(absl::Milliseconds(100));  // five more ticks
  }
  absl::MutexLock lock(&mu);
  ASSERT_EQ(sent.size(), 1u);  // once, not at every tick after
  EXPECT_EQ(sent[0].collectives, 1);
  EXPECT_EQ(sent[0].collective_ns, 30'000'000);
  EXPECT_DOUBLE_EQ(
      registry.GetCounter("ringmaster_rank_collective_seconds_total", "", labels).value(), 0.03);
}

}  // namespace
}  // namespace ringmaster
