#include "coordinator/state_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ringmaster {
namespace fs = std::filesystem;

namespace {

absl::Status Tighten(const fs::path& path, mode_t mode) {
  if (chmod(path.c_str(), mode) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot make %s private (chmod %03o): %s", path.string(), mode, std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status MakeStateDirPrivate(const std::string& dir) {
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) {
    return absl::FailedPreconditionError(absl::StrCat("cannot create it: ", error.message()));
  }
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot read it: ", std::strerror(errno)));
  }
  if (st.st_uid == geteuid()) {
    if (absl::Status s = Tighten(dir, 0700); !s.ok()) return s;
  } else if ((st.st_mode & S_IRWXO) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "it belongs to uid %d with mode %03o: other users could read the jobs' secrets in it, "
        "and this coordinator (uid %d) cannot make it private. Give it to the coordinator's "
        "user (chown), remove others' access (chmod o-rwx), or name a directory inside it that "
        "the coordinator creates",
        st.st_uid, st.st_mode & 07777, geteuid()));
  }
  // What an earlier version, or another umask, left readable. Entries of other users (a volume's
  // lost+found) are left alone: the coordinator never wrote them.
  for (auto it = fs::recursive_directory_iterator(dir, error);
       !error && it != fs::recursive_directory_iterator(); it.increment(error)) {
    struct stat entry {};
    if (lstat(it->path().c_str(), &entry) != 0 || entry.st_uid != geteuid()) continue;
    if (S_ISLNK(entry.st_mode)) continue;
    const mode_t want = S_ISDIR(entry.st_mode) ? 0700 : 0600;
    if ((entry.st_mode & 07777) == want) continue;
    if (absl::Status s = Tighten(it->path(), want); !s.ok()) return s;
  }
  if (error) {
    return absl::FailedPreconditionError(absl::StrCat("cannot read it: ", error.message()));
  }
  return absl::OkStatus();
}

}  // namespace ringmaster
