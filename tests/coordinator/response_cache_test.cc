#include "coordinator/response_cache.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TensorRequest Allreduce(const std::string& name, std::vector<int64_t> shape = {4}) {
  TensorRequest r;
  r.name = name;
  r.type = RequestType::kAllreduce;
  r.dtype = DataType::kFloat32;
  r.shape = std::move(shape);
  return r;
}

TEST(ResponseCacheTest, PutAssignsIncreasingIdsAndLooksThemUp) {
  ResponseCache cache(4);
  std::vector<uint32_t> evicted;
  EXPECT_EQ(cache.Put(Allreduce("a"), &evicted), 1u);
  EXPECT_EQ(cache.Put(Allreduce("b"), &evicted), 2u);
  EXPECT_THAT(evicted, IsEmpty());
  EXPECT_EQ(cache.size(), 2);
  EXPECT_EQ(cache.IdOf("a"), 1u);
  EXPECT_EQ(cache.IdOf("b"), 2u);
  EXPECT_EQ(cache.IdOf("c"), 0u);
  ASSERT_NE(cache.Lookup(2), nullptr);
  EXPECT_EQ(*cache.Lookup(2), Allreduce("b"));
  EXPECT_EQ(cache.Lookup(3), nullptr);
  EXPECT_EQ(cache.Lookup(0), nullptr);
}

TEST(ResponseCacheTest, CapacityZeroDisablesTheCache) {
  ResponseCache cache(0);
  std::vector<uint32_t> evicted;
  EXPECT_EQ(cache.Put(Allreduce("a"), &evicted), 0u);
  EXPECT_EQ(cache.size(), 0);
  EXPECT_EQ(cache.IdOf("a"), 0u);
  EXPECT_THAT(evicted, IsEmpty());
}

TEST(ResponseCacheTest, PuttingANameAgainReplacesItsEntryWithAFreshId) {
  ResponseCache cache(4);
  std::vector<uint32_t> evicted;
  ASSERT_EQ(cache.Put(Allreduce("a", {4}), &evicted), 1u);
  EXPECT_EQ(cache.Put(Allreduce("a", {8}), &evicted), 2u);
  EXPECT_THAT(evicted, ElementsAre(1u));
  EXPECT_EQ(cache.Lookup(1), nullptr);  // ids are never reused: the old id is now unknown
  ASSERT_NE(cache.Lookup(2), nullptr);
  EXPECT_EQ(cache.Lookup(2)->shape, std::vector<int64_t>({8}));
  EXPECT_EQ(cache.IdOf("a"), 2u);
  EXPECT_EQ(cache.size(), 1);
}

TEST(ResponseCacheTest, EvictsTheLeastRecentlyUsedAtCapacity) {
  ResponseCache cache(2);
  std::vector<uint32_t> evicted;
  ASSERT_EQ(cache.Put(Allreduce("a"), &evicted), 1u);
  ASSERT_EQ(cache.Put(Allreduce("b"), &evicted), 2u);
  cache.Touch(1);  // b is now the least recently used
  EXPECT_EQ(cache.Put(Allreduce("c"), &evicted), 3u);
  EXPECT_THAT(evicted, ElementsAre(2u));
  EXPECT_EQ(cache.IdOf("b"), 0u);
  EXPECT_EQ(cache.Lookup(2), nullptr);
  EXPECT_EQ(cache.IdOf("a"), 1u);
  EXPECT_EQ(cache.IdOf("c"), 3u);
  EXPECT_EQ(cache.size(), 2);

  // Without a touch, the oldest insertion goes first.
  evicted.clear();
  EXPECT_EQ(cache.Put(Allreduce("d"), &evicted), 4u);
  EXPECT_THAT(evicted, ElementsAre(1u));
}

TEST(ResponseCacheTest, TouchOfAnUnknownIdIsHarmless) {
  ResponseCache cache(2);
  std::vector<uint32_t> evicted;
  cache.Put(Allreduce("a"), &evicted);
  cache.Touch(99);
  EXPECT_EQ(cache.size(), 1);
  EXPECT_EQ(cache.IdOf("a"), 1u);
}

TEST(ResponseCacheTest, InvalidateRemovesTheEntryAndReturnsItsId) {
  ResponseCache cache(2);
  std::vector<uint32_t> evicted;
  cache.Put(Allreduce("a"), &evicted);
  cache.Put(Allreduce("b"), &evicted);
  EXPECT_EQ(cache.Invalidate("a"), 1u);
  EXPECT_EQ(cache.Invalidate("a"), 0u);
  EXPECT_EQ(cache.Invalidate("never"), 0u);
  EXPECT_EQ(cache.Lookup(1), nullptr);
  EXPECT_EQ(cache.size(), 1);
  // The freed slot is used without evicting b.
  EXPECT_EQ(cache.Put(Allreduce("c"), &evicted), 3u);
  EXPECT_THAT(evicted, IsEmpty());
  EXPECT_EQ(cache.IdOf("b"), 2u);
}

}  // namespace
}  // namespace ringmaster
