// The negotiation relay's two ends, with real sockets and an in-memory rendezvous store: a hub
// sends its host's batches in one message and splits the lists that come back; links that cannot
// be trusted or reached fall back; a failed hub lets its peers go.
#include "worker/negotiation/negotiation_relay.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/framing.h"
#include "common/negotiation_wire.h"
#include "common/secret.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

constexpr absl::Duration kWait = absl::Seconds(10);

v1::RequestBatch Batch(int rank, uint64_t seq, const std::string& tensor) {
  v1::RequestBatch b;
  b.set_job_id("job-1");
  b.set_epoch(1);
  b.set_rank(rank);
  b.set_seq(seq);
  b.add_requests()->set_name(tensor);
  return b;
}

// What a hub sent to the coordinator.
struct Sent {
  absl::Mutex mu;
  std::vector<v1::WorkerMessage> messages ABSL_GUARDED_BY(mu);
  absl::Status result;  // what `send` returns

  bool AwaitCount(size_t n) {
    absl::MutexLock lock(&mu);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return messages.size() >= n; };
    return mu.AwaitWithTimeout(absl::Condition(&enough), kWait);
  }
  // Waits for `n` batches in all, and returns their seqs in the order sent.
  std::vector<uint64_t> AwaitBatches(size_t n) {
    absl::MutexLock lock(&mu);
    auto seqs = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      std::vector<uint64_t> out;
      for (const v1::WorkerMessage& m : messages) {
        for (const v1::RequestBatch& b : m.relayed().batches()) out.push_back(b.seq());
      }
      return out;
    };
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return seqs().size() >= n; };
    mu.AwaitWithTimeout(absl::Condition(&enough), kWait);
    return seqs();
  }
  // The ranks of message i's batches, in order.
  std::vector<int> Ranks(size_t i) {
    absl::MutexLock lock(&mu);
    std::vector<int> out;
    for (const v1::RequestBatch& b : messages.at(i).relayed().batches()) out.push_back(b.rank());
    return out;
  }
};

// One peer's end, recording what it got.
struct Peer {
  absl::Mutex mu;
  std::vector<v1::ResponseList> lists ABSL_GUARDED_BY(mu);
  absl::Notification lost;
  std::string why;
  std::unique_ptr<RelayLink> link;

  void Start(std::shared_ptr<KeyValueStore> store, int rank, const std::string& token,
             absl::Duration find_timeout = kWait) {
    RelayLink::Options o;
    o.job_id = "job-1";
    o.epoch = 1;
    o.rank = rank;
    o.relay_rank = 0;
    o.token = token;
    o.store = std::move(store);
    o.find_timeout = find_timeout;
    o.on_list = [this](v1::ResponseList list) {
      absl::MutexLock lock(&mu);
      lists.push_back(std::move(list));
    };
    o.on_lost = [this](const absl::Status& s) {
      why = std::string(s.message());
      lost.Notify();
    };
    link = RelayLink::Start(std::move(o));
  }
  bool AwaitLists(size_t n) {
    absl::MutexLock lock(&mu);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return lists.size() >= n; };
    return mu.AwaitWithTimeout(absl::Condition(&enough), kWait);
  }
};

// Each case runs over both links: the abstract Unix socket of a relay for its own host, and TCP
// (on loopback) of a relay for a group of hosts.
class RelayTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() != "::1") return;
    // IPv6 may be off (a container without it): the case is skipped then.
    const int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in6 addr{};
    addr.sin6_family = AF_INET6;
    addr.sin6_addr = in6addr_loopback;
    const bool v6 = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    if (fd >= 0) close(fd);
    if (!v6) GTEST_SKIP() << "no IPv6 loopback here";
  }

  std::unique_ptr<RelayHub> StartHub(std::vector<int32_t> peers,
                                     absl::Duration linger = absl::Milliseconds(5)) {
    RelayHub::Options o;
    o.job_id = "job-1";
    o.epoch = 1;
    o.rank = 0;
    o.peers = std::move(peers);
    o.token = "secret";
    o.store = store_;
    o.send = [this](const v1::WorkerMessage& m) {
      absl::MutexLock lock(&sent_.mu);
      sent_.messages.push_back(m);
      return sent_.result;
    };
    o.linger = linger;
    o.tcp_address = GetParam();
    o.metrics = &metrics_;
    o.host = "host-a";
    absl::StatusOr<std::unique_ptr<RelayHub>> hub = RelayHub::Start(std::move(o));
    EXPECT_TRUE(hub.ok()) << hub.status();
    return hub.ok() ? *std::move(hub) : nullptr;
  }

  // Waits until the hub has `n` links open.
  static bool AwaitAttached(const RelayHub& hub, int n) {
    const absl::Time end = absl::Now() + kWait;
    while (hub.attached() < n && absl::Now() < end) absl::SleepFor(absl::Milliseconds(2));
    return hub.attached() == n;
  }

  // Links peers 1 and 2 to `hub` (with the epoch's token) and waits until both are attached.
  void Attach(const RelayHub& hub, Peer& one, Peer& two) {
    one.Start(store_, 1, "secret");
    two.Start(store_, 2, "secret");
    ASSERT_TRUE(AwaitAttached(hub, 2));
  }

  // The hub's series, as a daemon's /metrics serves them.
  double Series(const std::string& name) {
    const std::string text = metrics_.Exposition();
    const std::string line = absl::StrCat(name, "{job=\"job-1\",rank=\"0\",host=\"host-a\"} ");
    const size_t at = text.find(line);
    return at == std::string::npos ? -1 : std::stod(text.substr(at + line.size()));
  }

  MetricsRegistry metrics_;
  std::shared_ptr<KeyValueStore> store_ = KeyValueStore::InMemory();
  Sent sent_;
};

TEST_P(RelayTest, AHostsBatchesGoInOneMessageAndEachRankGetsItsOwnList) {
  std::unique_ptr<RelayHub> hub = StartHub({1, 2}, absl::Seconds(5));
  Peer one, two;
  ASSERT_NO_FATAL_FAILURE(Attach(*hub, one, two));

  // The lot goes once every attached rank has a batch in it, whatever the linger.
  EXPECT_EQ(one.link->Send(Batch(1, 1, "a")), RelayLink::Sent::kTaken);
  ASSERT_TRUE(hub->Submit(Batch(0, 1, "a")));
  absl::SleepFor(absl::Milliseconds(50));
  {
    absl::MutexLock lock(&sent_.mu);
    EXPECT_TRUE(sent_.messages.empty());  // rank 2's has not come
  }
  EXPECT_EQ(two.link->Send(Batch(2, 1, "a")), RelayLink::Sent::kTaken);
  ASSERT_TRUE(sent_.AwaitCount(1));
  EXPECT_THAT(sent_.Ranks(0), UnorderedElementsAre(0, 1, 2));  // in arrival order
  EXPECT_EQ(hub->relayed_batches(), 3);
  EXPECT_EQ(hub->messages_sent(), 1);
  EXPECT_EQ(Series("ringmaster_relay_batches_total"), 3);
  EXPECT_EQ(Series("ringmaster_relay_messages_total"), 1);
  EXPECT_EQ(Series("ringmaster_relay_links"), 2);

  // One list for the three: rank 2's own error reaches rank 2 alone.
  v1::RelayedResponses relayed;
  relayed.mutable_list()->set_job_id("job-1");
  relayed.mutable_list()->set_seq(1);
  relayed.mutable_list()->add_responses()->add_names("a");
  for (int r : {0, 1, 2}) relayed.add_ranks(r);
  v1::RelayedNotice* notice = relayed.add_notices();
  notice->set_rank(2);
  notice->mutable_part()->add_rank_errors()->set_error_message("rank 2's own");
  std::optional<v1::ResponseList> own = hub->Deliver(relayed);
  ASSERT_TRUE(own.has_value());
  EXPECT_EQ(own->seq(), 1u);
  EXPECT_EQ(own->rank_errors_size(), 0);
  ASSERT_TRUE(one.AwaitLists(1));
  ASSERT_TRUE(two.AwaitLists(1));
  absl::MutexLock lock1(&one.mu);
  absl::MutexLock lock2(&two.mu);
  EXPECT_EQ(one.lists[0].responses(0).names(0), "a");
  EXPECT_EQ(one.lists[0].rank_errors_size(), 0);
  ASSERT_EQ(two.lists[0].rank_errors_size(), 1);
  EXPECT_EQ(two.lists[0].rank_errors(0).error_message(), "rank 2's own");
  EXPECT_FALSE(one.lost.HasBeenNotified());
}

v1::RequestBatch ByIds(int rank, uint64_t seq, std::vector<uint32_t> ids) {
  v1::RequestBatch b;
  b.set_job_id("job-1");
  b.set_epoch(1);
  b.set_rank(rank);
  b.set_seq(seq);
  for (uint32_t id : ids) b.add_cached_ids(id);
  return b;
}

std::vector<uint32_t> Ids(const google::protobuf::RepeatedField<uint32_t>& ids) {
  return {ids.begin(), ids.end()};
}

TEST_P(RelayTest, CacheIdsThatEveryBatchHoldsGoOnceForTheWholeLot) {
  std::unique_ptr<RelayHub> hub = StartHub({1, 2}, absl::Seconds(5));
  Peer one, two;
  ASSERT_NO_FATAL_FAILURE(Attach(*hub, one, two));
  ASSERT_TRUE(hub->Submit(ByIds(0, 1, {7, 3, 9, 4})));
  EXPECT_EQ(one.link->Send(ByIds(1, 1, {9, 7, 4})), RelayLink::Sent::kTaken);
  EXPECT_EQ(two.link->Send(ByIds(2, 1, {4, 5, 7, 9})), RelayLink::Sent::kTaken);
  ASSERT_TRUE(sent_.AwaitCount(1));
  absl::MutexLock lock(&sent_.mu);
  const v1::RelayedBatches& m = sent_.messages[0].relayed();
  EXPECT_THAT(Ids(m.shared_cached_ids()), ElementsAre(7, 9, 4));  // in the first batch's order
  ASSERT_EQ(m.batches_size(), 3);
  for (const v1::RequestBatch& b : m.batches()) {
    if (b.rank() == 0) EXPECT_THAT(Ids(b.cached_ids()), ElementsAre(3));
    if (b.rank() == 1) EXPECT_THAT(Ids(b.cached_ids()), ElementsAre());
    if (b.rank() == 2) EXPECT_THAT(Ids(b.cached_ids()), ElementsAre(5));
    EXPECT_EQ(b.seq(), 1u);
  }
}

TEST(ShareCachedIdsTest, OnlyIdsEveryBatchHoldsOnceAreShared) {
  // One batch: nothing moves.
  v1::RelayedBatches one;
  *one.add_batches() = ByIds(0, 1, {1, 2});
  ShareCachedIds(&one);
  EXPECT_THAT(Ids(one.shared_cached_ids()), ElementsAre());
  EXPECT_THAT(Ids(one.batches(0).cached_ids()), ElementsAre(1, 2));

  // An id a batch holds twice stays in the batches (the coordinator names the error per rank);
  // so does one a batch lacks. Two batches of one rank share nothing they do not both hold.
  v1::RelayedBatches m;
  *m.add_batches() = ByIds(0, 1, {1, 2, 2, 3, 6});
  *m.add_batches() = ByIds(1, 1, {3, 2, 1, 6});
  *m.add_batches() = ByIds(1, 2, {6, 1, 2, 3});
  ShareCachedIds(&m);
  EXPECT_THAT(Ids(m.shared_cached_ids()), ElementsAre(1, 3, 6));
  EXPECT_THAT(Ids(m.batches(0).cached_ids()), ElementsAre(2, 2));
  EXPECT_THAT(Ids(m.batches(1).cached_ids()), ElementsAre(2));
  EXPECT_THAT(Ids(m.batches(2).cached_ids()), ElementsAre(2));

  // Ids past the table's reach (a job whose cache turned over many times) are shared alike.
  v1::RelayedBatches large;
  *large.add_batches() = ByIds(0, 1, {70000, 5, 70001, 70001});
  *large.add_batches() = ByIds(1, 1, {70001, 5, 70000});
  ShareCachedIds(&large);
  EXPECT_THAT(Ids(large.shared_cached_ids()), ElementsAre(70000, 5));
  EXPECT_THAT(Ids(large.batches(0).cached_ids()), ElementsAre(70001, 70001));
  EXPECT_THAT(Ids(large.batches(1).cached_ids()), ElementsAre(70001));

  // A batch with no ids: nothing is shared.
  v1::RelayedBatches none;
  *none.add_batches() = ByIds(0, 1, {1});
  *none.add_batches() = ByIds(1, 1, {});
  ShareCachedIds(&none);
  EXPECT_THAT(Ids(none.shared_cached_ids()), ElementsAre());
  EXPECT_THAT(Ids(none.batches(0).cached_ids()), ElementsAre(1));
}

TEST_P(RelayTest, ALotThatWaitsTheLingerGoesWithoutTheRanksThatSentNothing) {
  std::unique_ptr<RelayHub> hub = StartHub({1, 2}, absl::Milliseconds(5));
  Peer one, two;
  ASSERT_NO_FATAL_FAILURE(Attach(*hub, one, two));
  ASSERT_TRUE(hub->Submit(Batch(0, 1, "a")));
  EXPECT_EQ(one.link->Send(Batch(1, 1, "a")), RelayLink::Sent::kTaken);
  ASSERT_TRUE(sent_.AwaitCount(1));
  EXPECT_THAT(sent_.Ranks(0), UnorderedElementsAre(0, 1));
  // Rank 2's comes alone later, and waits the linger too.
  EXPECT_EQ(two.link->Send(Batch(2, 1, "a")), RelayLink::Sent::kTaken);
  ASSERT_TRUE(sent_.AwaitCount(2));
  EXPECT_THAT(sent_.Ranks(1), ElementsAre(2));
}

TEST_P(RelayTest, BatchesSentBeforeTheRelayIsFoundGoFirstInTheirOrder) {
  Peer one;
  one.Start(store_, 1, "secret");
  EXPECT_EQ(one.link->Send(Batch(1, 1, "a")), RelayLink::Sent::kTaken);
  EXPECT_EQ(one.link->Send(Batch(1, 2, "b")), RelayLink::Sent::kTaken);
  std::unique_ptr<RelayHub> hub = StartHub({1}, absl::Milliseconds(1));
  EXPECT_THAT(sent_.AwaitBatches(2), ElementsAre(1, 2));
  EXPECT_EQ(one.link->Send(Batch(1, 3, "c")), RelayLink::Sent::kTaken);
  EXPECT_THAT(sent_.AwaitBatches(3), ElementsAre(1, 2, 3));
}

TEST_P(RelayTest, ALinkWithoutTheEpochsTokenIsRefusedAndItsRankGoesDirect) {
  std::unique_ptr<RelayHub> hub = StartHub({1});
  Peer intruder;
  intruder.Start(store_, 1, "guess");
  ASSERT_TRUE(intruder.lost.WaitForNotificationWithTimeout(kWait));
  EXPECT_THAT(intruder.why, HasSubstr("closed"));
  EXPECT_EQ(hub->attached(), 0);
  // Its batches are held for the resume, then go on the session once it resumed.
  EXPECT_EQ(intruder.link->Send(Batch(1, 1, "a")), RelayLink::Sent::kHeld);
  intruder.link->EndRelaying();
  EXPECT_EQ(intruder.link->Send(Batch(1, 1, "a")), RelayLink::Sent::kDirect);
}

TEST_P(RelayTest, RefusedConnectionsGiveTheirSlotsBackSoTheRealPeerStillGetsIn) {
  std::unique_ptr<RelayHub> hub = StartHub({1});
  // Twice as many refused links as the hub has slots (its host's ranks and 8 more).
  for (int i = 0; i < 20; ++i) {
    Peer intruder;
    intruder.Start(store_, 1, "guess");
    ASSERT_TRUE(intruder.lost.WaitForNotificationWithTimeout(kWait)) << i;
  }
  Peer one;
  one.Start(store_, 1, "secret");
  ASSERT_TRUE(AwaitAttached(*hub, 1));
  EXPECT_FALSE(one.lost.HasBeenNotified());
}

TEST_P(RelayTest, ARankThatIsNotOnTheRelaysHostIsRefused) {
  std::unique_ptr<RelayHub> hub = StartHub({1});
  Peer other;
  other.Start(store_, 3, "secret");  // rank 3 is not among the hub's peers
  ASSERT_TRUE(other.lost.WaitForNotificationWithTimeout(kWait));
  EXPECT_EQ(hub->attached(), 0);
}

TEST_P(RelayTest, ARelayThatIsNeverNamedIsGivenUpOnAtTheFindTimeout) {
  Peer one;
  const absl::Time start = absl::Now();
  one.Start(store_, 1, "secret", absl::Milliseconds(300));
  ASSERT_TRUE(one.lost.WaitForNotificationWithTimeout(kWait));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(300));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_THAT(one.why, HasSubstr("could not be found"));
}

TEST_P(RelayTest, AFailedHubLetsEveryPeerGoAndTakesNothingMore) {
  std::unique_ptr<RelayHub> hub = StartHub({1, 2});
  Peer one, two;
  ASSERT_NO_FATAL_FAILURE(Attach(*hub, one, two));
  EXPECT_EQ(Series("ringmaster_relay_links"), 2);
  hub->Fail("its session ended");
  ASSERT_TRUE(one.lost.WaitForNotificationWithTimeout(kWait));
  ASSERT_TRUE(two.lost.WaitForNotificationWithTimeout(kWait));
  EXPECT_FALSE(hub->Submit(Batch(0, 1, "a")));
  EXPECT_EQ(hub->attached(), 0);
  EXPECT_EQ(Series("ringmaster_relay_links"), 0);
}

TEST_P(RelayTest, AFailedSendFailsTheHub) {
  sent_.result = absl::UnavailableError("not connected to the coordinator");
  std::unique_ptr<RelayHub> hub = StartHub({1});
  Peer one;
  one.Start(store_, 1, "secret");
  ASSERT_TRUE(AwaitAttached(*hub, 1));
  ASSERT_TRUE(hub->Submit(Batch(0, 1, "a")));
  EXPECT_EQ(one.link->Send(Batch(1, 1, "a")), RelayLink::Sent::kTaken);
  ASSERT_TRUE(one.lost.WaitForNotificationWithTimeout(kWait));
  EXPECT_FALSE(hub->Submit(Batch(0, 2, "b")));
}

INSTANTIATE_TEST_SUITE_P(Links, RelayTest, ::testing::Values("", "127.0.0.1", "::1"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param.empty()    ? "Unix"
                                  : info.param == "::1" ? "Tcp6"
                                                        : "Tcp";
                         });

// A raw TCP connection to 127.0.0.1:`port`, giving up on a read after 10 s.
int ConnectRaw(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval tv = absl::ToTimeval(kWait);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

v1::RelayLinkMessage OpenFor(int rank, const std::string& proof) {
  v1::RelayLinkMessage open;
  open.mutable_open()->set_job_id("job-1");
  open.mutable_open()->set_epoch(1);
  open.mutable_open()->set_rank(rank);
  open.mutable_open()->set_proof(proof);
  return open;
}

TEST_P(RelayTest, TheRelayIsNamedForItsLinkAndChallengesEachConnectionAnew) {
  std::unique_ptr<RelayHub> hub = StartHub({1, 2});
  absl::StatusOr<std::vector<std::string>> name = store_->Wait({RelayKey(0)}, kWait);
  ASSERT_TRUE(name.ok()) << name.status();
  EXPECT_EQ((*name)[0], hub->name());
  if (GetParam().empty()) {
    EXPECT_THAT(hub->name(), ::testing::StartsWith("ringmaster-relay-job-1-1-0-"));
    return;
  }
  if (GetParam() == "::1") {
    EXPECT_THAT(hub->name(), ::testing::MatchesRegex(R"(tcp:\[::1\]:[0-9]+)"));
    return;
  }
  ASSERT_THAT(hub->name(), ::testing::StartsWith("tcp:127.0.0.1:"));
  const int port = std::stoi(hub->name().substr(std::string("tcp:127.0.0.1:").size()));
  // Each connection is sent a fresh 64-hex-digit nonce first, before it says anything.
  const int first = ConnectRaw(port);
  const int second = ConnectRaw(port);
  v1::RelayLinkChallenge one, two;
  ASSERT_TRUE(ReadFrame(first, &one).ok());
  ASSERT_TRUE(ReadFrame(second, &two).ok());
  EXPECT_THAT(one.nonce(), ::testing::MatchesRegex("[0-9a-f]{64}"));
  EXPECT_THAT(two.nonce(), ::testing::MatchesRegex("[0-9a-f]{64}"));
  EXPECT_NE(one.nonce(), two.nonce());
  // The proof of the first challenge (an HMAC keyed with the token) opens the first link, and
  // replayed on the second connection opens nothing: the token itself opens nothing either.
  const std::string proof =
      HmacSha256Hex("secret", absl::StrCat("ringmaster relay link\njob-1\n1\n1\n", one.nonce()));
  ASSERT_TRUE(WriteFrame(first, OpenFor(1, proof)).ok());
  ASSERT_TRUE(AwaitAttached(*hub, 1));
  ASSERT_TRUE(WriteFrame(second, OpenFor(2, proof)).ok());
  v1::ResponseList list;
  EXPECT_FALSE(ReadFrame(second, &list).ok());  // closed
  const int third = ConnectRaw(port);
  v1::RelayLinkChallenge three;
  ASSERT_TRUE(ReadFrame(third, &three).ok());
  ASSERT_TRUE(WriteFrame(third, OpenFor(2, "secret")).ok());
  EXPECT_FALSE(ReadFrame(third, &list).ok());  // closed
  EXPECT_EQ(hub->attached(), 1);
  // A connection that sends a frame longer than a handshake's is closed before it is read.
  const int fourth = ConnectRaw(port);
  v1::RelayLinkChallenge four;
  ASSERT_TRUE(ReadFrame(fourth, &four).ok());
  const char huge[4] = {0, 0, 0, 0x04};  // 64 MiB announced
  ASSERT_EQ(write(fourth, huge, 4), 4);
  EXPECT_FALSE(ReadFrame(fourth, &list).ok());  // closed
  for (int fd : {first, second, third, fourth}) close(fd);
}

TEST(RelayPlanTest, TheLowestRankOnEachHostRelaysWhenTheKnobIsOn) {
  v1::JobAssignment a;
  a.mutable_job()->mutable_spec()->mutable_knobs()->set_negotiation_relay(true);
  for (int r = 0; r < 5; ++r) {
    v1::RankInfo* info = a.mutable_job()->add_ranks();
    info->set_rank(r);
    info->set_host(r == 4 ? "c" : (r % 2 == 0 ? "a" : "b"));
  }
  a.set_rank(3);
  RelayPlan plan = PlanRelay(a);
  EXPECT_EQ(plan.relay_rank, 1);
  EXPECT_THAT(plan.ranks, ElementsAre(1, 3));
  EXPECT_FALSE(plan.spans_hosts);
  a.set_rank(4);  // alone on its host
  EXPECT_EQ(PlanRelay(a).relay_rank, -1);
  a.set_rank(2);
  a.mutable_job()->mutable_spec()->mutable_knobs()->set_negotiation_relay(false);
  EXPECT_EQ(PlanRelay(a).relay_rank, -1);
}

TEST(RelayPlanTest, WithRelayHostsAGroupOfHostsSharesTheRelayOfItsLowestRank) {
  v1::JobAssignment a;
  a.mutable_job()->mutable_spec()->mutable_knobs()->set_negotiation_relay(true);
  a.mutable_job()->mutable_spec()->mutable_knobs()->set_negotiation_relay_hosts(2);
  // Hosts a, b, c with ranks a: 0 2, b: 1 3, c: 4 5.
  const char* hosts[] = {"a", "b", "a", "b", "c", "c"};
  for (int r = 0; r < 6; ++r) {
    v1::RankInfo* info = a.mutable_job()->add_ranks();
    info->set_rank(r);
    info->set_host(hosts[r]);
  }
  a.set_rank(3);
  RelayPlan plan = PlanRelay(a);
  EXPECT_EQ(plan.relay_rank, 0);
  EXPECT_THAT(plan.ranks, ElementsAre(0, 1, 2, 3));
  EXPECT_TRUE(plan.spans_hosts);
  a.set_rank(5);  // host c is a group of its own
  plan = PlanRelay(a);
  EXPECT_EQ(plan.relay_rank, 4);
  EXPECT_THAT(plan.ranks, ElementsAre(4, 5));
  EXPECT_FALSE(plan.spans_hosts);
}

}  // namespace
}  // namespace ringmaster
