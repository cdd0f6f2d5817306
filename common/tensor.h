// Tensor descriptors shared by the coordinator and the workers. The enum values equal those of the
// wire contract (proto/ringmaster/v1/common.proto), so conversion is a cast after a range check.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace ringmaster {

enum class DataType : int32_t {
  kUnspecified = 0,
  kUint8 = 1,
  kInt8 = 2,
  kInt32 = 3,
  kInt64 = 4,
  kFloat16 = 5,
  kBfloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
};
inline constexpr int32_t kMaxDataType = 8;

enum class RequestType : int32_t {
  kUnspecified = 0,
  kAllreduce = 1,
  kAllgather = 2,
  kBroadcast = 3,
  kJoin = 4,
  kBarrier = 5,
};
inline constexpr int32_t kMaxRequestType = 5;

// A barrier of every rank with this name followed by a process set's id releases the set's
// communicators on every rank once it completes (Horovod's remove_process_set).
inline constexpr char kReleaseProcessSetPrefix[] = "process_set.release.";

enum class ReduceOp : int32_t {
  kUnspecified = 0,  // means kAverage, Horovod's default
  kAverage = 1,
  kSum = 2,
  kMin = 3,
  kMax = 4,
  kProduct = 5,
};
inline constexpr int32_t kMaxReduceOp = 5;

// Bytes per element; 0 for kUnspecified.
int DataTypeSize(DataType dtype);
// "float32", "int64", ...
absl::string_view DataTypeName(DataType dtype);
// "allreduce", "broadcast", ...
absl::string_view RequestTypeName(RequestType type);
// "average", "sum", ...
absl::string_view ReduceOpName(ReduceOp op);
// "cpu" for -1, "cuda:N" otherwise.
std::string DeviceName(int32_t device);
// "[2, 3, 4]"
std::string ShapeString(absl::Span<const int64_t> shape);
// A tensor name as messages quote it: whole up to kMaxQuotedName bytes; longer, its first 96
// bytes, "...", and its length ("abc... (1048576 bytes)"), so an error stays readable.
inline constexpr size_t kMaxQuotedName = 128;
std::string QuotedName(absl::string_view name);
// Product of the dimensions (1 for a scalar).
int64_t NumElements(absl::Span<const int64_t> shape);

}  // namespace ringmaster
