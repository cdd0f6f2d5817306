// Secrets the coordinator hands out (a worker's session secret, a job epoch's rendezvous token):
// made from the kernel's random source, kept and compared as SHA-256 digests where they are stored.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace ringmaster {

// 32 random bytes from getrandom(2), as 64 lowercase hex digits.
std::string RandomSecret();

// SHA-256 of `data`, as 64 lowercase hex digits.
std::string Sha256Hex(absl::string_view data);

// HMAC-SHA256 of `data` keyed with `key`, as 64 lowercase hex digits ("" if OpenSSL fails).
std::string HmacSha256Hex(absl::string_view key, absl::string_view data);

// Whether `a` equals `b`, in time that depends on their lengths only (not on where they differ).
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace ringmaster
