#include "worker/gpu/fusion_layout.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster {
namespace {

using ::testing::ElementsAre;

TEST(FusionLayoutTest, TensorsStartAtAlignedOffsetsInResponseOrder) {
  // float32 tensors of 3, 64 and 1 elements: 12, 256 and 4 bytes.
  absl::StatusOr<FusionLayout> l = PlanFusion({12, 256, 4}, 4, 256);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_THAT(l->offsets, ElementsAre(0, 256, 512));
  EXPECT_THAT(l->bytes, ElementsAre(12, 256, 4));
  EXPECT_EQ(l->total_bytes, 768);
  EXPECT_EQ(l->padding_bytes, 768 - 272);
  EXPECT_EQ(l->Elements(4), 192);
}

TEST(FusionLayoutTest, AlignedSizesNeedNoPadding) {
  absl::StatusOr<FusionLayout> l = PlanFusion({1024, 2048}, 8, 256);
  ASSERT_TRUE(l.ok());
  EXPECT_THAT(l->offsets, ElementsAre(0, 1024));
  EXPECT_EQ(l->total_bytes, 3072);
  EXPECT_EQ(l->padding_bytes, 0);
}

TEST(FusionLayoutTest, EmptyTensorsTakeNoSpace) {
  absl::StatusOr<FusionLayout> l = PlanFusion({0, 2, 0, 2}, 2, 16);
  ASSERT_TRUE(l.ok());
  EXPECT_THAT(l->offsets, ElementsAre(0, 0, 16, 16));
  EXPECT_EQ(l->total_bytes, 32);
  EXPECT_TRUE(PlanFusion({}, 4).ok());
  EXPECT_EQ(PlanFusion({}, 4)->total_bytes, 0);
}

TEST(FusionLayoutTest, BadInputIsRefusedWithTheReason) {
  EXPECT_EQ(PlanFusion({8}, 4, 96).status().message(),
            "fusion alignment 96 must be a power of two and a multiple of the 4-byte element");
  EXPECT_EQ(PlanFusion({8}, 8, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanFusion({8, 6}, 4).status().message(),
            "tensor 1 of the fused response has 6 bytes, not a whole number of 4-byte elements");
  EXPECT_EQ(PlanFusion({-4}, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanFusion({int64_t{1} << 61, int64_t{1} << 61, 8}, 4).status().message(),
            "the fused response is larger than 2^62 bytes");
}

}  // namespace
}  // namespace ringmaster
