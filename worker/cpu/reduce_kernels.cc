#include "worker/cpu/reduce_kernels.h"

#include <cstdint>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/half.h"

namespace ringmaster {
namespace {

// How an element is stored and the type it is reduced in: integers and floats as themselves, the
// 16-bit floats widened to float32 and rounded back to nearest-even after every step.
template <typename T>
struct Native {
  using Storage = T;
  static T Load(T v) { return v; }
  static T Store(T v) { return v; }
};
struct Float16 {
  using Storage = uint16_t;
  static float Load(uint16_t v) { return HalfToFloat(v); }
  static uint16_t Store(float v) { return FloatToHalf(v); }
};
struct Bfloat16 {
  using Storage = uint16_t;
  static float Load(uint16_t v) { return Bfloat16ToFloat(v); }
  static uint16_t Store(float v) { return FloatToBfloat16(v); }
};

// Integers wrap around (two's complement), as they would in the framework's own kernels; signed
// overflow is undefined in C++, so the arithmetic is done unsigned.
template <typename V>
V Add(V a, V b) {
  if constexpr (std::is_integral_v<V>) {
    using U = std::make_unsigned_t<V>;
    return static_cast<V>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}
template <typename V>
V Multiply(V a, V b) {
  if constexpr (std::is_integral_v<V>) {
    using U = std::make_unsigned_t<V>;
    return static_cast<V>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  } else {
    return a * b;
  }
}

// Gloo's reduction callback: out[i] = a[i] op b[i] for n elements; out may alias a or b.
template <typename Codec, ReduceOp kOp>
void Reduce(void* out, const void* a, const void* b, size_t n) {
  using S = typename Codec::Storage;
  S* o = static_cast<S*>(out);
  const S* x = static_cast<const S*>(a);
  const S* y = static_cast<const S*>(b);
  if constexpr (kOp == ReduceOp::kSum && std::is_floating_point_v<S>) {
    // The hot case (gradients): in place, no aliasing between the two inputs, so it vectorises.
    if (o == x) {
      S* __restrict acc = o;
      const S* __restrict in = y;
      for (size_t i = 0; i < n; ++i) acc[i] += in[i];
      return;
    }
    if (o != y) {  // three distinct buffers (the shared-memory group's first step)
      S* __restrict sum = o;
      const S* __restrict lhs = x;
      const S* __restrict rhs = y;
      for (size_t i = 0; i < n; ++i) sum[i] = lhs[i] + rhs[i];
      return;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const auto lhs = Codec::Load(x[i]);
    const auto rhs = Codec::Load(y[i]);
    if constexpr (kOp == ReduceOp::kSum) {
      o[i] = Codec::Store(Add(lhs, rhs));
    } else if constexpr (kOp == ReduceOp::kProduct) {
      o[i] = Codec::Store(Multiply(lhs, rhs));
    } else if constexpr (kOp == ReduceOp::kMin) {
      o[i] = rhs < lhs ? y[i] : x[i];  // Min and max pick an input, bits and all.
    } else {
      static_assert(kOp == ReduceOp::kMax);
      o[i] = lhs < rhs ? y[i] : x[i];
    }
  }
}

template <typename Codec>
ReduceFn ReduceFor(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return &Reduce<Codec, ReduceOp::kSum>;
    case ReduceOp::kMin:
      return &Reduce<Codec, ReduceOp::kMin>;
    case ReduceOp::kMax:
      return &Reduce<Codec, ReduceOp::kMax>;
    case ReduceOp::kProduct:
      return &Reduce<Codec, ReduceOp::kProduct>;
    default:
      return nullptr;
  }
}

}  // namespace

absl::StatusOr<ReduceFn> ReduceFunction(DataType dtype, ReduceOp op) {
  if (op != ReduceOp::kSum && op != ReduceOp::kMin && op != ReduceOp::kMax &&
      op != ReduceOp::kProduct) {
    return absl::InvalidArgumentError(
        absl::StrCat("allreduce supports sum, min, max and product, not ", ReduceOpName(op),
                     " (the engine averages by summing, then scaling)"));
  }
  switch (dtype) {
    case DataType::kUint8:
      return ReduceFor<Native<uint8_t>>(op);
    case DataType::kInt8:
      return ReduceFor<Native<int8_t>>(op);
    case DataType::kInt32:
      return ReduceFor<Native<int32_t>>(op);
    case DataType::kInt64:
      return ReduceFor<Native<int64_t>>(op);
    case DataType::kFloat16:
      return ReduceFor<Float16>(op);
    case DataType::kBfloat16:
      return ReduceFor<Bfloat16>(op);
    case DataType::kFloat32:
      return ReduceFor<Native<float>>(op);
    case DataType::kFloat64:
      return ReduceFor<Native<double>>(op);
    case DataType::kUnspecified:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("allreduce: unsupported data type ", static_cast<int32_t>(dtype)));
}

}  // namespace ringmaster
