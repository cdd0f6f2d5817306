#include "coordinator/rendezvous_store.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster {
namespace {

using ::testing::ElementsAre;

constexpr absl::Time kNow = absl::FromUnixSeconds(1'700'000'000);

// Records what a Wait() callback received, and how often.
struct Outcome {
  int calls = 0;
  std::optional<absl::StatusOr<std::vector<std::string>>> result;

  RendezvousStore::WaitCallback Callback() {
    return [this](absl::StatusOr<std::vector<std::string>> r) {
      ++calls;
      result = std::move(r);
    };
  }
};

TEST(RendezvousStoreTest, ScopeIsJobAndEpoch) {
  EXPECT_EQ(RendezvousStore::Scope("job-000001", 2), "job-000001/2");
}

TEST(RendezvousStoreTest, SetThenGetWithinAScope) {
  RendezvousStore store;
  ASSERT_TRUE(store.Set("job-000001/1", "rank0/addr", "10.0.0.1:4000").ok());
  EXPECT_EQ(store.Get("job-000001/1", "rank0/addr").value(), "10.0.0.1:4000");
  ASSERT_TRUE(store.Set("job-000001/1", "rank0/addr", "10.0.0.1:4001").ok());  // overwrite
  EXPECT_EQ(store.Get("job-000001/1", "rank0/addr").value(), "10.0.0.1:4001");
  ASSERT_TRUE(store.Set("job-000001/1", "empty", "").ok());
  EXPECT_EQ(store.Get("job-000001/1", "empty").value(), "");
}

TEST(RendezvousStoreTest, ScopesAreIsolated) {
  RendezvousStore store;
  ASSERT_TRUE(store.Set("job-000001/1", "k", "epoch one").ok());
  ASSERT_TRUE(store.Set("job-000002/1", "k", "other job").ok());
  EXPECT_EQ(store.Get("job-000001/1", "k").value(), "epoch one");
  EXPECT_EQ(store.Get("job-000002/1", "k").value(), "other job");
  absl::StatusOr<std::string> other_epoch = store.Get("job-000001/2", "k");
  EXPECT_EQ(other_epoch.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(other_epoch.status().message(), "key 'k' is not set");
}

TEST(RendezvousStoreTest, KeyAndValueLimits) {
  RendezvousStore store;
  absl::Status empty = store.Set("s", "", "v");
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(empty.message(), "key must be 1..1024 bytes; got 0");
  EXPECT_EQ(store.Set("s", std::string(1025, 'k'), "v").message(),
            "key must be 1..1024 bytes; got 1025");
  EXPECT_TRUE(store.Set("s", std::string(1024, 'k'), "v").ok());
  absl::Status big = store.Set("s", "k", std::string((4 << 20) + 1, 'v'));
  EXPECT_EQ(big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(big.message(), "value of key 'k' is 4194305 bytes; at most 4 MiB");
  EXPECT_EQ(store.Get("s", "k").status().code(), absl::StatusCode::kNotFound);  // nothing stored
  EXPECT_TRUE(store.Set("s", "k", std::string(4 << 20, 'v')).ok());
  EXPECT_EQ(store.Get("s", "").status().message(), "key must be 1..1024 bytes; got 0");
}

TEST(RendezvousStoreTest, WaitOnSetKeysAnswersAtOnce) {
  RendezvousStore store;
  ASSERT_TRUE(store.Set("s", "a", "1").ok());
  ASSERT_TRUE(store.Set("s", "b", "2").ok());
  Outcome out;
  store.Wait("s", {"b", "a"}, kNow + absl::Seconds(1), out.Callback());
  EXPECT_EQ(out.calls, 1);
  ASSERT_TRUE(out.result->ok());
  EXPECT_THAT(**out.result, ElementsAre("2", "1"));  // in the order asked
}

TEST(RendezvousStoreTest, WaitAnswersWhenTheLastKeyIsSetInItsScope) {
  RendezvousStore store;
  Outcome out;
  store.Wait("s", {"a", "b"}, kNow + absl::Seconds(30), out.Callback());
  EXPECT_EQ(out.calls, 0);
  ASSERT_TRUE(store.Set("s", "a", "1").ok());
  ASSERT_TRUE(store.Set("other-scope", "b", "x").ok());
  EXPECT_EQ(out.calls, 0);
  ASSERT_TRUE(store.Set("s", "b", "2").ok());
  EXPECT_EQ(out.calls, 1);
  ASSERT_TRUE(out.result->ok());
  EXPECT_THAT(**out.result, ElementsAre("1", "2"));
  ASSERT_TRUE(store.Set("s", "b", "3").ok());
  EXPECT_EQ(out.calls, 1);  // answered once
  store.ExpireWaiters(kNow + absl::Hours(1));
  EXPECT_EQ(out.calls, 1);
}

TEST(RendezvousStoreTest, WaitTimesOutAtItsDeadlineNamingTheMissingKeys) {
  RendezvousStore store;
  ASSERT_TRUE(store.Set("s", "a", "1").ok());
  Outcome late, later;
  store.Wait("s", {"a", "b", "c"}, kNow + absl::Seconds(5), late.Callback());
  store.Wait("s", {"c"}, kNow + absl::Seconds(6), later.Callback());

  store.ExpireWaiters(kNow + absl::Seconds(5) - absl::Nanoseconds(1));
  EXPECT_EQ(late.calls, 0);
  store.ExpireWaiters(kNow + absl::Seconds(5));
  EXPECT_EQ(late.calls, 1);
  EXPECT_EQ(late.result->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(late.result->status().message(), "rendezvous wait timed out; keys not set: b, c");
  EXPECT_EQ(later.calls, 0);

  ASSERT_TRUE(store.Set("s", "c", "3").ok());
  EXPECT_EQ(later.calls, 1);
  ASSERT_TRUE(later.result->ok());
  EXPECT_EQ(late.calls, 1);
}

TEST(RendezvousStoreTest, DropScopeAbortsItsWaitersAndForgetsItsKeys) {
  RendezvousStore store;
  ASSERT_TRUE(store.Set("job-000001/1", "a", "1").ok());
  ASSERT_TRUE(store.Set("job-000002/1", "a", "1").ok());
  Outcome dropped, kept;
  store.Wait("job-000001/1", {"b"}, kNow + absl::Seconds(5), dropped.Callback());
  store.Wait("job-000002/1", {"b"}, kNow + absl::Seconds(5), kept.Callback());

  store.DropScope("job-000001/1", "job job-000001 ended: cancelled by user");
  EXPECT_EQ(dropped.calls, 1);
  EXPECT_EQ(dropped.result->status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(dropped.result->status().message(), "job job-000001 ended: cancelled by user");
  EXPECT_EQ(kept.calls, 0);
  EXPECT_EQ(store.Get("job-000001/1", "a").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.Get("job-000002/1", "a").value(), "1");

  ASSERT_TRUE(store.Set("job-000002/1", "b", "2").ok());
  EXPECT_EQ(kept.calls, 1);
  EXPECT_TRUE(kept.result->ok());
}

TEST(RendezvousStoreTest, AbortAllFailsEveryWaiterWithUnavailable) {
  RendezvousStore store;
  Outcome a, b;
  store.Wait("s1", {"k"}, kNow + absl::Seconds(5), a.Callback());
  store.Wait("s2", {"k"}, kNow + absl::Seconds(5), b.Callback());
  store.AbortAll("server stopping");
  for (Outcome* o : {&a, &b}) {
    EXPECT_EQ(o->calls, 1);
    EXPECT_EQ(o->result->status().code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(o->result->status().message(), "server stopping");
  }
  ASSERT_TRUE(store.Set("s1", "k", "v").ok());
  EXPECT_EQ(a.calls, 1);
}

TEST(RendezvousStoreTest, WaitRejectsBadKeyLists) {
  RendezvousStore store;
  Outcome none, bad, many;
  store.Wait("s", {}, kNow + absl::Seconds(1), none.Callback());
  EXPECT_EQ(none.calls, 1);
  EXPECT_EQ(none.result->status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(none.result->status().message(), "keys must hold 1..4096 keys; got 0");

  store.Wait("s", {"a", ""}, kNow + absl::Seconds(1), bad.Callback());
  EXPECT_EQ(bad.calls, 1);
  EXPECT_EQ(bad.result->status().message(), "key must be 1..1024 bytes; got 0");

  store.Wait("s", std::vector<std::string>(4097, "k"), kNow + absl::Seconds(1), many.Callback());
  EXPECT_EQ(many.calls, 1);
  EXPECT_EQ(many.result->status().message(), "keys must hold 1..4096 keys; got 4097");

  // None of them was left waiting.
  ASSERT_TRUE(store.Set("s", "a", "1").ok());
  ASSERT_TRUE(store.Set("s", "k", "1").ok());
  EXPECT_EQ(none.calls + bad.calls + many.calls, 3);
}

TEST(RendezvousStoreTest, CallbackMayUseTheStore) {
  RendezvousStore store;
  std::string seen;
  store.Wait("s", {"a"}, kNow + absl::Seconds(1), [&](absl::StatusOr<std::vector<std::string>> r) {
    ASSERT_TRUE(r.ok());
    // Runs with the store's lock released: calling back in must not deadlock.
    ASSERT_TRUE(store.Set("s", "b", (*r)[0] + "!").ok());
    seen = store.Get("s", "b").value();
  });
  ASSERT_TRUE(store.Set("s", "a", "hi").ok());
  EXPECT_EQ(seen, "hi!");
}

}  // namespace
}  // namespace ringmaster

namespace ringmaster {
namespace {

TEST(RendezvousStoreBoundsTest, AJobEpochHoldsAtMostItsKeysBytesAndWaits) {
  RendezvousStore store;
  const std::string scope = RendezvousStore::Scope("job-000001", 1);
  for (size_t i = 0; i < RendezvousStore::kMaxScopeKeys; ++i) {
    ASSERT_TRUE(store.Set(scope, absl::StrCat("k", i), "v").ok()) << i;
  }
  absl::Status s = store.Set(scope, "one-more", "v");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(),
            "the rendezvous of job-000001/1 holds 65536 keys, the most one job epoch "
            "may; key 'one-more' not set");
  EXPECT_EQ(store.Get(scope, "one-more").status().code(), absl::StatusCode::kNotFound);
  // A key already there may be set again; another job's epoch is not affected.
  EXPECT_TRUE(store.Set(scope, "k7", "w").ok());
  EXPECT_EQ(*store.Get(scope, "k7"), "w");
  const std::string other = RendezvousStore::Scope("job-000002", 1);
  EXPECT_TRUE(store.Set(other, "k", "v").ok());

  // Bytes: 256 values of 4 MiB fill 1 GiB; the next one is refused.
  const std::string big(RendezvousStore::kMaxValueBytes, 'x');
  for (int i = 0; i < 255; ++i) ASSERT_TRUE(store.Set(other, absl::StrCat("b", i), big).ok()) << i;
  s = store.Set(other, "b255", big);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(),
            "the rendezvous of job-000002/1 would hold more than 1024 MiB, the most "
            "one job epoch may; key 'b255' not set");
  // Dropping the scope gives it all back.
  store.DropScope(other, "ended");
  EXPECT_TRUE(store.Set(other, "b255", big).ok());

  // Waits: kMaxScopeWaiters parked, then refused at once.
  int aborted = 0;
  const absl::Time later = absl::Now() + absl::Hours(1);
  for (size_t i = 0; i < RendezvousStore::kMaxScopeWaiters; ++i) {
    store.Wait(scope, {"never"}, later, [&](absl::StatusOr<std::vector<std::string>> v) {
      if (v.status().code() == absl::StatusCode::kAborted) ++aborted;
    });
  }
  absl::Status refused;
  store.Wait(scope, {"never"}, later,
             [&](absl::StatusOr<std::vector<std::string>> v) { refused = v.status(); });
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(refused.message(),
            "the rendezvous of job-000001/1 has 16384 waits parked, the most one job epoch may");
  store.DropScope(scope, "ended");
  EXPECT_EQ(aborted, 16384);
}

}  // namespace
}  // namespace ringmaster
