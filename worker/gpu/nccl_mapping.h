// Ringmaster's types and results in NCCL's terms: data types, reductions, and ncclResult_t as
// absl::Status with NCCL's own message and the rank named. Needs nccl.h only; tested on machines
// without a GPU.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tensor.h"
#include "nccl.h"

namespace ringmaster {

// INVALID_ARGUMENT for kUnspecified.
absl::StatusOr<ncclDataType_t> ToNcclDataType(DataType dtype);

// How an allreduce of `op` runs on NCCL: NCCL's op, and what the unpack must still divide by.
// Averaging is Horovod's: a sum, then the unpack multiplies by postscale / size (computed in
// double, applied in the tensor's type; integers divided and truncated), as on CPU workers. ncclAvg
// is not used: it scales before summing, which rounds differently (e.g. by 1/3 for 3 ranks).
struct NcclReduction {
  ncclRedOp_t op = ncclSum;
  int divide_by = 1;
};
// kUnspecified means kAverage, as in Horovod. INVALID_ARGUMENT for an op NCCL cannot run.
absl::StatusOr<NcclReduction> ToNcclReduction(ReduceOp op, int size);

// OK for ncclSuccess; otherwise a status whose code says what kind of failure it is
// (UNAVAILABLE: a peer or the network, INVALID_ARGUMENT / FAILED_PRECONDITION: misuse, INTERNAL:
// CUDA or NCCL itself, DEADLINE_EXCEEDED never: that is the watchdog's) and whose message names
// `what` ("allreduce"), `where` ("rank 3 (host-b, cuda:1)"), the result's name and `detail` (NCCL's
// ncclGetLastError text; may be empty).
absl::Status NcclStatus(ncclResult_t result, absl::string_view what, absl::string_view where,
                        absl::string_view detail = "");

// The same code, and only the failure in the message: "a remote peer failed or exited, or the
// network broke (ncclRemoteError): <detail>" (for a caller that names the rank itself).
absl::Status NcclFailure(ncclResult_t result, absl::string_view detail);

// "ncclRemoteError" etc.
absl::string_view NcclResultName(ncclResult_t result);

}  // namespace ringmaster
