// Length-prefixed protobuf messages on a stream socket (the worker's local API): a 4-byte
// little-endian length, then the serialized message. Blocking; callers own the threads.
#pragma once

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace google::protobuf {
class MessageLite;
}

namespace ringmaster {

inline constexpr uint32_t kMaxFrameBytes = 64 << 20;

// UNAVAILABLE when the peer is gone.
absl::Status WriteFrame(int fd, const google::protobuf::MessageLite& message);
// UNAVAILABLE (with "closed" in the message) at end of stream; DATA_LOSS for a malformed frame.
absl::Status ReadFrame(int fd, google::protobuf::MessageLite* message);

// ReadFrame from a peer not yet trusted: a frame of at most `max_bytes` (DATA_LOSS past it, before
// anything is allocated), read whole by `deadline` (DEADLINE_EXCEEDED then, however slowly its
// bytes trickle in).
absl::Status ReadFrameBy(int fd, google::protobuf::MessageLite* message, uint32_t max_bytes,
                         absl::Time deadline);

// Passes a file descriptor over a Unix socket (SCM_RIGHTS) with a one-byte message.
absl::Status SendFd(int socket, int fd);
// Receives one; the caller owns the returned descriptor.
absl::StatusOr<int> ReceiveFd(int socket);

}  // namespace ringmaster
