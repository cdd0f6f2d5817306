// Ringmaster's types and results in NCCL's terms. Needs nccl.h only: runs without a GPU.
#include "worker/gpu/nccl_mapping.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/gpu/nccl_backend.h"

namespace ringmaster {
namespace {

TEST(NcclMappingTest, EveryDataTypeHasItsNcclType) {
  EXPECT_EQ(*ToNcclDataType(DataType::kUint8), ncclUint8);
  EXPECT_EQ(*ToNcclDataType(DataType::kInt8), ncclInt8);
  EXPECT_EQ(*ToNcclDataType(DataType::kInt32), ncclInt32);
  EXPECT_EQ(*ToNcclDataType(DataType::kInt64), ncclInt64);
  EXPECT_EQ(*ToNcclDataType(DataType::kFloat16), ncclFloat16);
  EXPECT_EQ(*ToNcclDataType(DataType::kBfloat16), ncclBfloat16);
  EXPECT_EQ(*ToNcclDataType(DataType::kFloat32), ncclFloat32);
  EXPECT_EQ(*ToNcclDataType(DataType::kFloat64), ncclFloat64);
  EXPECT_EQ(ToNcclDataType(DataType::kUnspecified).status().message(),
            "data type 0 has no NCCL equivalent");
}

TEST(NcclMappingTest, AveragingIsASumDividedByTheRanksWhenUnpackingAsInHorovod) {
  for (ReduceOp op : {ReduceOp::kAverage, ReduceOp::kUnspecified}) {
    absl::StatusOr<NcclReduction> r = ToNcclReduction(op, 3);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->op, ncclSum);
    EXPECT_EQ(r->divide_by, 3);
  }
}

TEST(NcclMappingTest, OtherReductionsMapOneToOne) {
  EXPECT_EQ(ToNcclReduction(ReduceOp::kSum, 4)->op, ncclSum);
  EXPECT_EQ(ToNcclReduction(ReduceOp::kMin, 4)->op, ncclMin);
  EXPECT_EQ(ToNcclReduction(ReduceOp::kMax, 4)->op, ncclMax);
  EXPECT_EQ(ToNcclReduction(ReduceOp::kProduct, 4)->op, ncclProd);
  EXPECT_EQ(ToNcclReduction(ReduceOp::kProduct, 4)->divide_by, 1);
  EXPECT_EQ(ToNcclReduction(static_cast<ReduceOp>(42), 4).status().message(),
            "reduce op 42 has no NCCL equivalent");
}

TEST(NcclMappingTest, ResultsBecomeStatusesNamingTheRankAndNcclsMessage) {
  EXPECT_TRUE(NcclStatus(ncclSuccess, "allreduce", "rank 0 (h, cuda:0)").ok());
  absl::Status remote =
      NcclStatus(ncclRemoteError, "allreduce", "rank 3 (host-b, cuda:1)",
                 "socketProgress: Connection closed by remote peer 10.0.0.7<39157>");
  EXPECT_EQ(remote.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(remote.message(),
            "NCCL allreduce on rank 3 (host-b, cuda:1) failed: a remote peer failed or exited, or "
            "the network broke (ncclRemoteError): socketProgress: Connection closed by remote peer "
            "10.0.0.7<39157>");
  EXPECT_EQ(NcclStatus(ncclSystemError, "broadcast", "r").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(NcclStatus(ncclInvalidUsage, "setup", "r").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(NcclStatus(ncclInvalidArgument, "setup", "r").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NcclStatus(ncclUnhandledCudaError, "allreduce", "r").code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(NcclStatus(ncclInternalError, "allreduce", "r").message(),
            "NCCL allreduce on r failed: internal NCCL error (ncclInternalError)");
  EXPECT_EQ(NcclResultName(ncclInProgress), "ncclInProgress");
  // Without the operation and rank (the watchdog names the rank itself).
  absl::Status bare = NcclFailure(ncclRemoteError, "peer 10.0.0.7 closed");
  EXPECT_EQ(bare.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(bare.message(),
            "a remote peer failed or exited, or the network broke (ncclRemoteError): peer "
            "10.0.0.7 closed");
  EXPECT_TRUE(NcclFailure(ncclSuccess, "").ok());
}

TEST(NcclMappingTest, AnAbsentDeviceIsAClearError) {
  // Whatever this machine has, device 4096 is not among it.
  absl::Status s = CheckCudaDevice(4096);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), ::testing::StartsWith("cuda:4096 "));
  if (CudaDeviceCount() == 0) {
    // No GPU (or no driver): device 0 is refused with CUDA's reason.
    EXPECT_EQ(CheckCudaDevice(0).code(), absl::StatusCode::kFailedPrecondition);
  }
}

}  // namespace
}  // namespace ringmaster
