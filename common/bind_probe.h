// Why a TCP address cannot be listened on, for error messages: servers that fail to bind (gRPC's
// builder says only that it failed) ask the operating system by binding a probe socket.
#pragma once

#include <string>

namespace ringmaster {

// strerror of binding a TCP socket to `address` ("host:port", "[v6]:port"; SO_REUSEADDR, as every
// server here sets, and no SO_REUSEPORT), e.g. "Address already in use"; "" when the bind succeeds
// (the probe socket is closed again at once). Names the resolution failure for a host that does not
// resolve.
std::string BindError(const std::string& address);

}  // namespace ringmaster
