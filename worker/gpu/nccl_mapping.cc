#include "worker/gpu/nccl_mapping.h"

#include "absl/strings/str_cat.h"

namespace ringmaster {
namespace {}  // namespace

absl::StatusOr<ncclDataType_t> ToNcclDataType(DataType dtype) {
  switch (dtype) {
    case DataType::kUint8:
      return ncclUint8;
    case DataType::kInt8:
      return ncclInt8;
    case DataType::kInt32:
      return ncclInt32;
    case DataType::kInt64:
      return ncclInt64;
    case DataType::kFloat16:
      return ncclFloat16;
    case DataType::kBfloat16:
      return ncclBfloat16;
    case DataType::kFloat32:
      return ncclFloat32;
    case DataType::kFloat64:
      return ncclFloat64;
    case DataType::kUnspecified:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("data type ", static_cast<int>(dtype), " has no NCCL equivalent"));
}

absl::StatusOr<NcclReduction> ToNcclReduction(ReduceOp op, int size) {
  switch (op) {
    case ReduceOp::kUnspecified:
    case ReduceOp::kAverage:
      return NcclReduction{ncclSum, size};
    case ReduceOp::kSum:
      return NcclReduction{ncclSum, 1};
    case ReduceOp::kMin:
      return NcclReduction{ncclMin, 1};
    case ReduceOp::kMax:
      return NcclReduction{ncclMax, 1};
    case ReduceOp::kProduct:
      return NcclReduction{ncclProd, 1};
  }
  return absl::InvalidArgumentError(
      absl::StrCat("reduce op ", static_cast<int>(op), " has no NCCL equivalent"));
}

absl::string_view NcclResultName(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "ncclSuccess";
    case ncclUnhandledCudaError:
      return "ncclUnhandledCudaError";
    case ncclSystemError:
      return "ncclSystemError";
    case ncclInternalError:
      return "ncclInternalError";
    case ncclInvalidArgument:
      return "ncclInvalidArgument";
    case ncclInvalidUsage:
      return "ncclInvalidUsage";
    case ncclRemoteError:
      return "ncclRemoteError";
    case ncclInProgress:
      return "ncclInProgress";
    default:
      break;
  }
  return "ncclUnknownResult";
}

absl::Status NcclStatus(ncclResult_t result, absl::string_view what, absl::string_view where,
                        absl::string_view detail) {
  absl::Status failure = NcclFailure(result, detail);
  if (failure.ok()) return failure;
  return absl::Status(failure.code(),
                      absl::StrCat("NCCL ", what, " on ", where, " failed: ", failure.message()));
}

absl::Status NcclFailure(ncclResult_t result, absl::string_view detail) {
  if (result == ncclSuccess) return absl::OkStatus();
  absl::StatusCode code;
  absl::string_view meaning;
  switch (result) {
    case ncclSystemError:
      code = absl::StatusCode::kUnavailable;
      meaning = "a system call failed (often the network, or a peer that went away)";
      break;
    case ncclRemoteError:
      code = absl::StatusCode::kUnavailable;
      meaning = "a remote peer failed or exited, or the network broke";
      break;
    case ncclInvalidArgument:
      code = absl::StatusCode::kInvalidArgument;
      meaning = "invalid argument";
      break;
    case ncclInvalidUsage:
      code = absl::StatusCode::kFailedPrecondition;
      meaning = "invalid usage (e.g. two ranks on one GPU, or mismatched calls)";
      break;
    case ncclUnhandledCudaError:
      code = absl::StatusCode::kInternal;
      meaning = "a CUDA call failed";
      break;
    case ncclInProgress:
      code = absl::StatusCode::kUnavailable;
      meaning = "still in progress (a non-blocking call was not waited for)";
      break;
    default:
      code = absl::StatusCode::kInternal;
      meaning = "internal NCCL error";
      break;
  }
  std::string message = absl::StrCat(meaning, " (", NcclResultName(result), ")");
  if (!detail.empty()) absl::StrAppend(&message, ": ", detail);
  return absl::Status(code, message);
}

}  // namespace ringmaster
