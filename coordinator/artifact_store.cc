#include "coordinator/artifact_store.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/knobs.h"
#include "common/source_archive.h"

namespace ringmaster {

namespace fs = std::filesystem;

std::string DefaultArtifactsDir(const std::string& instance) {
  const char* tmp = std::getenv("TMPDIR");
  return absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/ringmaster-artifacts-",
                      getuid(), "/", instance);
}

std::string ArtifactsInstanceName(const std::string& address) {
  const size_t colon = address.rfind(':');
  const std::string port = colon == std::string::npos ? "" : address.substr(colon + 1);
  if (port.empty() || port == "0") return absl::StrCat("pid-", getpid());
  std::string name;
  for (char c : address) {
    // "[::1]:50051" -> "--1-50051": only characters that are safe in one path component.
    name += absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' ? c : '-';
  }
  return name;
}

std::string ArtifactStore::JobDir(const std::string& job_id) const {
  return absl::StrCat(root_, "/", job_id);
}

std::string ArtifactStore::PathOf(const std::string& job_id, const std::string& name) const {
  return absl::StrCat(JobDir(job_id), "/", name);
}

void ArtifactStore::Remove(const std::string& job_id) const {
  std::error_code error;
  fs::remove_all(JobDir(job_id), error);
}

absl::Status ArtifactStore::Reset(const std::string& job_id) const {
  std::error_code error;
  // The root and its parent (the user's directory of every coordinator's roots) are private to
  // the coordinator's user: they may live in a shared /tmp.
  const fs::path parent = fs::path(root_).parent_path();
  if (!parent.empty() && fs::create_directories(parent, error)) {
    fs::permissions(parent, fs::perms::owner_all, fs::perm_options::replace, error);
  }
  error.clear();
  if (fs::create_directories(root_, error)) {
    fs::permissions(root_, fs::perms::owner_all, fs::perm_options::replace, error);
  }
  error.clear();
  fs::remove_all(JobDir(job_id), error);
  if (!fs::create_directories(JobDir(job_id), error) && error) {
    return absl::UnavailableError(
        absl::StrCat("cannot create artifact directory ", JobDir(job_id), ": ", error.message()));
  }
  return absl::OkStatus();
}

absl::Status ArtifactStore::ResetRank(const std::string& job_id, int32_t rank) const {
  std::error_code error;
  const std::string dir = absl::StrCat(JobDir(job_id), "/rank-", rank);
  fs::remove_all(dir, error);
  error.clear();
  if (!fs::create_directories(dir, error) && error) {
    return absl::UnavailableError(absl::StrCat("cannot create ", dir, ": ", error.message()));
  }
  return absl::OkStatus();
}

std::string ArtifactStore::RankFilePath(const std::string& job_id, int32_t rank,
                                        const std::string& path) const {
  return absl::StrCat(JobDir(job_id), "/rank-", rank, "/", path);
}

std::vector<ArtifactInfo> ArtifactStore::List(const std::string& job_id) const {
  std::vector<ArtifactInfo> out;
  std::error_code error;
  const fs::path dir = JobDir(job_id);
  for (auto it = fs::recursive_directory_iterator(dir, error);
       !error && it != fs::recursive_directory_iterator(); it.increment(error)) {
    if (!it->is_regular_file(error) || it->is_symlink(error)) continue;
    out.push_back({it->path().lexically_relative(dir).generic_string(),
                   static_cast<int64_t>(it->file_size(error))});
  }
  std::sort(out.begin(), out.end(),
            [](const ArtifactInfo& a, const ArtifactInfo& b) { return a.name < b.name; });
  return out;
}

absl::StatusOr<std::string> ArtifactStore::Read(const std::string& job_id, const std::string& name,
                                                int64_t offset, int64_t max_bytes) const {
  const bool rank_file = absl::StartsWith(name, "rank-") && ValidateRelativePath("name", name).ok();
  if (!rank_file && !ValidateArtifactName("name", name).ok()) {
    return absl::NotFoundError(absl::StrCat("job ", job_id, " has no artifact '", name, "'"));
  }
  std::ifstream in(PathOf(job_id, name), std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("job ", job_id, " has no artifact '", name, "'"));
  }
  in.seekg(offset);
  std::string out(static_cast<size_t>(std::max<int64_t>(max_bytes, 0)), '\0');
  in.read(out.data(), static_cast<std::streamsize>(out.size()));
  out.resize(static_cast<size_t>(std::max<std::streamsize>(in.gcount(), 0)));
  return out;
}

}  // namespace ringmaster
