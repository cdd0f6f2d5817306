// A job's code as it travels: a tar.gz archive of the user's source directory (libarchive), packed
// by the CLI, checked by the coordinator, and unpacked by each rank's worker. Also the check of the
// relative paths ranks' output files come back under.
//
// Stateless functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ringmaster {

// What unpacking an archive may produce at most: a small archive must not unpack to fill a disk.
inline constexpr int64_t kMaxSourceUnpackedBytes = int64_t{1} << 30;
inline constexpr int64_t kMaxSourceEntries = 100'000;
// The default bound on the archive itself (the coordinator's --max-source-bytes).
inline constexpr int64_t kDefaultMaxSourceBytes = int64_t{64} << 20;

struct ArchiveSummary {
  int32_t files = 0;           // regular files
  int64_t unpacked_bytes = 0;  // their sizes summed
};

// Packs directory `dir` (its contents, with paths relative to it; symbolic links as links) into a
// tar.gz archive in memory. INVALID_ARGUMENT for a missing directory, or once the archive grows
// past `max_bytes` (the message names the limit).
absl::StatusOr<std::string> PackDirectory(const std::string& dir, int64_t max_bytes);

// Reads the whole archive at `path` and checks every member: a regular file, a directory or a
// symbolic link whose target stays inside the archive, with a relative path free of ".." whose
// components are 1..255 bytes; at most kMaxSourceEntries members and kMaxSourceUnpackedBytes of
// file data. INVALID_ARGUMENT naming the member otherwise (or when it is not a tar.gz archive).
absl::StatusOr<ArchiveSummary> InspectArchive(const std::string& path);

// Unpacks the archive at `path` into directory `dest` (created), refusing what InspectArchive
// refuses, and never writing outside `dest` (libarchive's secure-extraction checks as well).
absl::Status ExtractArchive(const std::string& path, const std::string& dest);

// INVALID_ARGUMENT naming `field` unless `path` is relative, at most 4096 bytes, and made of
// components of 1..255 bytes none of which is "." or ".." (no empty component, no NUL).
absl::Status ValidateRelativePath(absl::string_view field, absl::string_view path);

// The SHA-256 of the file at `path` as 64 lowercase hex digits; UNAVAILABLE when it cannot be read.
absl::StatusOr<std::string> Sha256OfFile(const std::string& path);

}  // namespace ringmaster
