// The reduction kernels of the CPU data plane: out[i] = a[i] op b[i], one function per (dtype, op),
// shared by the Gloo backend (as Gloo's reduce callback) and the shared-memory host group. Integers
// wrap around; float16 and bfloat16 are reduced as their float32 values rounded back to
// nearest-even; min and max pick an input, bits and all. Float sums vectorise.
#pragma once

#include <cstddef>

#include "absl/status/statusor.h"
#include "common/tensor.h"

namespace ringmaster {

// out may alias a or b.
using ReduceFn = void (*)(void* out, const void* a, const void* b, size_t n);

// INVALID_ARGUMENT for an op other than sum, min, max and product (averaging is a sum the engine
// then scales) or an unknown dtype.
absl::StatusOr<ReduceFn> ReduceFunction(DataType dtype, ReduceOp op);

}  // namespace ringmaster
