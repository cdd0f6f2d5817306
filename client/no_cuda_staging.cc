// Builds without CUDA: a GPU slot cannot be served.
#include "client/staging.h"

namespace ringmaster {

absl::StatusOr<std::unique_ptr<Staging>> OpenDeviceStaging(const DeviceArena& /*arena*/) {
  return absl::FailedPreconditionError(
      "the worker serves a GPU, but this client was built without CUDA");
}

}  // namespace ringmaster
