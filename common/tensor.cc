#include "common/tensor.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ringmaster {

int DataTypeSize(DataType dtype) {
  switch (dtype) {
    case DataType::kUint8:
    case DataType::kInt8:
      return 1;
    case DataType::kFloat16:
    case DataType::kBfloat16:
      return 2;
    case DataType::kInt32:
    case DataType::kFloat32:
      return 4;
    case DataType::kInt64:
    case DataType::kFloat64:
      return 8;
    case DataType::kUnspecified:
      break;
  }
  return 0;
}

absl::string_view DataTypeName(DataType dtype) {
  switch (dtype) {
    case DataType::kUint8:
      return "uint8";
    case DataType::kInt8:
      return "int8";
    case DataType::kInt32:
      return "int32";
    case DataType::kInt64:
      return "int64";
    case DataType::kFloat16:
      return "float16";
    case DataType::kBfloat16:
      return "bfloat16";
    case DataType::kFloat32:
      return "float32";
    case DataType::kFloat64:
      return "float64";
    case DataType::kUnspecified:
      break;
  }
  return "unspecified";
}

absl::string_view RequestTypeName(RequestType type) {
  switch (type) {
    case RequestType::kAllreduce:
      return "allreduce";
    case RequestType::kAllgather:
      return "allgather";
    case RequestType::kBroadcast:
      return "broadcast";
    case RequestType::kJoin:
      return "join";
    case RequestType::kBarrier:
      return "barrier";
    case RequestType::kUnspecified:
      break;
  }
  return "unspecified";
}

absl::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kUnspecified:
    case ReduceOp::kAverage:
      return "average";
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kProduct:
      return "product";
  }
  return "unspecified";
}

std::string DeviceName(int32_t device) {
  return device < 0 ? std::string("cpu") : absl::StrCat("cuda:", device);
}

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string QuotedName(absl::string_view name) {
  if (name.size() <= kMaxQuotedName) return std::string(name);
  return absl::StrCat(name.substr(0, 96), "... (", name.size(), " bytes)");
}

int64_t NumElements(absl::Span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace ringmaster
