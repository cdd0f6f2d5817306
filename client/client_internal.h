// What the client library does under Client::Connect, for its tests.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "ringmaster/client.h"

namespace ringmaster {

// Greets the daemon on the connected socket `fd` (hello; its welcome and arena descriptor; on a GPU
// slot, the ready events) and returns the client over it, which owns `fd`. On failure `fd` is
// closed, and `retry` says whether trying again may succeed (the daemon has no job yet) or not (the
// rank is another process's, the arena cannot be mapped).
absl::StatusOr<std::unique_ptr<Client>> Handshake(int fd, bool* retry);

}  // namespace ringmaster
