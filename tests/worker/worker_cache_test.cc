#include "worker/worker_cache.h"

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

}  // namespace
}  // namespace ringmaster
