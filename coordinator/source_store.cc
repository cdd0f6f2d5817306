#include "coordinator/source_store.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/source_archive.h"
#include "spdlog/spdlog.h"

namespace ringmaster {

namespace fs = std::filesystem;

absl::StatusOr<std::unique_ptr<SourceStore::Upload>> SourceStore::Begin() {
  if (uploads_.fetch_add(1) >= max_uploads_) {
    uploads_.fetch_sub(1);
    return absl::ResourceExhaustedError(absl::StrCat(
        max_uploads_, " source archives are being uploaded already; try again when one is done"));
  }
  std::error_code error;
  if (fs::create_directories(root_, error)) {
    fs::permissions(root_, fs::perms::owner_all, fs::perm_options::replace, error);
  }
  const std::string path =
      absl::StrCat(root_, "/.upload-", getpid(), "-", next_upload_.fetch_add(1), ".tmp");
  std::unique_ptr<Upload> upload(new Upload(*this, path));
  upload->out_.open(path, std::ios::binary | std::ios::trunc);
  if (!upload->out_) {
    return absl::UnavailableError(absl::StrCat("cannot write the source archive to ", path));
  }
  return upload;
}

SourceStore::Upload::~Upload() {
  out_.close();
  if (!committed_) {
    std::error_code error;
    fs::remove(path_, error);
  }
  store_.uploads_.fetch_sub(1);
}

absl::Status SourceStore::Upload::Append(absl::string_view data) {
  bytes_ += static_cast<int64_t>(data.size());
  if (bytes_ > store_.max_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the source archive is larger than the coordinator's limit of ", store_.max_bytes_,
        " bytes (--max-source-bytes): leave data and outputs out of the source directory"));
  }
  out_.write(data.data(), static_cast<std::streamsize>(data.size()));
  if (!out_) return absl::UnavailableError(absl::StrCat("cannot write ", path_));
  return absl::OkStatus();
}

absl::StatusOr<SourceArchive> SourceStore::Upload::Commit() {
  out_.close();
  if (!out_) return absl::UnavailableError(absl::StrCat("cannot write ", path_));
  absl::StatusOr<ArchiveSummary> summary = InspectArchive(path_);
  if (!summary.ok()) return summary.status();
  absl::StatusOr<std::string> sha = Sha256OfFile(path_);
  if (!sha.ok()) return sha.status();
  std::error_code error;
  fs::rename(path_, store_.PathOf(*sha), error);
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("cannot store the source archive: ", error.message()));
  }
  committed_ = true;
  SourceArchive out;
  out.sha256 = *sha;
  out.size_bytes = bytes_;
  out.unpacked_bytes = summary->unpacked_bytes;
  out.files = summary->files;
  return out;
}

std::string SourceStore::PathOf(const std::string& sha256) const {
  return absl::StrCat(root_, "/", sha256, ".tar.gz");
}

bool SourceStore::Has(const std::string& sha256) const {
  std::error_code error;
  return sha256.size() == 64 && fs::is_regular_file(PathOf(sha256), error);
}

void SourceStore::RemoveUnreferenced(const std::set<std::string>& referenced,
                                     absl::Duration grace) const {
  std::error_code error;
  const auto cutoff =
      fs::file_time_type::clock::now() - std::chrono::seconds(absl::ToInt64Seconds(grace));
  for (const fs::directory_entry& e : fs::directory_iterator(root_, error)) {
    const std::string name = e.path().filename().string();
    if (!absl::EndsWith(name, ".tar.gz") && !absl::EndsWith(name, ".tmp")) continue;
    const std::string sha = name.substr(0, name.find('.'));
    if (!sha.empty() && referenced.count(sha) > 0) continue;
    std::error_code time_error;
    const auto written = e.last_write_time(time_error);
    if (time_error || written > cutoff) continue;
    // An upload in flight removes its own file; one left by a coordinator that died mid-upload
    // goes after an hour.
    if (absl::EndsWith(name, ".tmp") &&
        written > fs::file_time_type::clock::now() - std::chrono::hours(1)) {
      continue;
    }
    fs::remove(e.path(), error);
    spdlog::info("removed source archive {}: no job refers to it any more", name);
  }
}

}  // namespace ringmaster
