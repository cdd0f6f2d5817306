// What the client library does under Client::Connect, for its tests.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "ringmaster/client.h"

namespace ringmaster {

// Greets the daemon on the connected socket `fd` (hello; its welcome and arena descriptor; on a GPU
// slot, the ready events) and returns the client over it, which owns `fd`. On failure `fd` is
// closed, and `retry` says whether trying again may succeed (the daemon has no job yet) or not (the
// rank is another process's, the arena cannot be mapped).
// `attach`: the attached job's name and the rank this process claims (LocalHello.attach_job,
// attach_rank); none by default.
struct AttachClaim {
  std::string job_name;  // empty: none
  int32_t rank = 0;
};
// `after_epoch`: LocalHello.after_epoch (0: the job's current epoch).
absl::StatusOr<std::unique_ptr<Client>> Handshake(int fd, bool* retry,
                                                  const AttachClaim& attach = {},
                                                  int64_t after_epoch = 0);
// The claim the environment makes: RINGMASTER_ATTACH_JOB, with RINGMASTER_ATTACH_RANK or a
// Kubernetes Indexed Job's JOB_COMPLETION_INDEX. INVALID_ARGUMENT naming the variable when the rank
// is missing or not a number.
absl::StatusOr<AttachClaim> AttachClaimFromEnvironment();

}  // namespace ringmaster
