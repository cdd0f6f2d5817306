#include "worker/negotiation/worker_cache.h"

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ringmaster {
namespace {

TensorRequest Allreduce(const std::string& name) {
  TensorRequest r;
  r.name = name;
  r.type = RequestType::kAllreduce;
  r.dtype = DataType::kFloat32;
  r.shape = {4};
  return r;
}

TEST(WorkerCacheTest, AnEvictedEntryIsKeptForAResendOnlyWhileItsOperationIsInFlight) {
  WorkerCache cache;
  cache.Assign("a", 1, Allreduce("a"));
  cache.Assign("b", 2, Allreduce("b"));
  EXPECT_EQ(cache.Find(Allreduce("a")), 1u);
  cache.Evict(1, /*in_flight=*/true);
  cache.Evict(2, /*in_flight=*/false);
  EXPECT_EQ(cache.Find(Allreduce("a")), 0u);  // sent in full from now on
  EXPECT_EQ(cache.NameOf(1), nullptr);
  std::optional<TensorRequest> resent = cache.TakeForResend(1);
  ASSERT_TRUE(resent.has_value());
  EXPECT_EQ(resent->name, "a");
  EXPECT_FALSE(cache.TakeForResend(1).has_value());  // taken once
  EXPECT_FALSE(cache.TakeForResend(2).has_value());  // completed: nothing to resend
}

TEST(WorkerCacheTest, EvictedRequestsKeptAreBoundedOldestFirstOut) {
  // A job that names every call anew: every name is cached once and evicted.
  WorkerCache cache;
  const uint32_t n = WorkerCache::kMaxEvicted + 100;
  for (uint32_t id = 1; id <= n; ++id) {
    const std::string name = absl::StrCat("allreduce.noname.", id);
    cache.Assign(name, id, Allreduce(name));
    cache.Evict(id, /*in_flight=*/true);
  }
  EXPECT_FALSE(cache.TakeForResend(1).has_value());
  EXPECT_FALSE(cache.TakeForResend(100).has_value());
  std::optional<TensorRequest> kept = cache.TakeForResend(101);
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(kept->name, "allreduce.noname.101");
  EXPECT_TRUE(cache.TakeForResend(n).has_value());
}

TEST(WorkerCacheTest, AnAutomaticNameFindsItsFamilysLastEntryWithTheSameMetadata) {
  EXPECT_EQ(AutomaticFamily("allreduce.noname.17"), "allreduce.noname.");
  EXPECT_EQ(AutomaticFamily("grad.noname.3"), "grad.noname.");
  EXPECT_EQ(AutomaticFamily("allreduce.noname."), "");
  EXPECT_EQ(AutomaticFamily("allreduce.noname.1x"), "");
  EXPECT_EQ(AutomaticFamily(".noname.1"), "");
  EXPECT_EQ(AutomaticFamily("weights"), "");

  WorkerCache cache;
  EXPECT_EQ(cache.FindFamily(Allreduce("allreduce.noname.5")), 0u);  // nothing cached yet
  cache.Assign("allreduce.noname.1", 7, Allreduce("allreduce.noname.1"));
  cache.Assign("allreduce.noname.2", 8, Allreduce("allreduce.noname.2"));
  EXPECT_EQ(cache.Find(Allreduce("allreduce.noname.5")), 0u);        // by name: never
  EXPECT_EQ(cache.FindFamily(Allreduce("allreduce.noname.5")), 8u);  // the last assigned
  EXPECT_EQ(cache.FindFamily(Allreduce("allgather.noname.5")), 0u);  // another family
  EXPECT_EQ(cache.FindFamily(Allreduce("named")), 0u);
  TensorRequest other_shape = Allreduce("allreduce.noname.5");
  other_shape.shape = {5};
  EXPECT_EQ(cache.FindFamily(other_shape), 0u);
  TensorRequest sum = Allreduce("allreduce.noname.5");
  sum.reduce_op = ReduceOp::kSum;
  EXPECT_EQ(cache.FindFamily(sum), 0u);

  // The family follows its entry out: evicted, taken for a resend, or its id given to another.
  cache.Evict(8, /*in_flight=*/false);
  EXPECT_EQ(cache.FindFamily(Allreduce("allreduce.noname.5")), 0u);
  cache.Assign("allreduce.noname.3", 9, Allreduce("allreduce.noname.3"));
  ASSERT_TRUE(cache.TakeForResend(9).has_value());
  EXPECT_EQ(cache.FindFamily(Allreduce("allreduce.noname.5")), 0u);
  cache.Assign("allreduce.noname.4", 10, Allreduce("allreduce.noname.4"));
  cache.Assign("weights", 10, Allreduce("weights"));
  EXPECT_EQ(cache.FindFamily(Allreduce("allreduce.noname.5")), 0u);
  ASSERT_NE(cache.NameOf(10), nullptr);
  EXPECT_EQ(*cache.NameOf(10), "weights");
  EXPECT_EQ(cache.Find(Allreduce("allreduce.noname.4")), 0u);
  EXPECT_EQ(cache.Find(Allreduce("weights")), 10u);
}

}  // namespace
}  // namespace ringmaster
