#include "common/source_archive.h"

#include <archive.h>
#include <archive_entry.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <system_error>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ringmaster {
namespace {

namespace fs = std::filesystem;

struct ReadCloser {
  void operator()(archive* a) const { archive_read_free(a); }
};
struct WriteCloser {
  void operator()(archive* a) const { archive_write_free(a); }
};
struct EntryFree {
  void operator()(archive_entry* e) const { archive_entry_free(e); }
};
using Reader = std::unique_ptr<archive, ReadCloser>;
using Writer = std::unique_ptr<archive, WriteCloser>;

std::string ErrorOf(archive* a) {
  const char* s = archive_error_string(a);
  return s != nullptr ? s : "unknown libarchive error";
}

// The archive's member name without a leading "./" and trailing '/'; "" for the root itself.
std::string MemberPath(const char* raw) {
  std::string p = raw != nullptr ? raw : "";
  while (absl::StartsWith(p, "./")) p.erase(0, 2);
  while (!p.empty() && p.back() == '/') p.pop_back();
  return p == "." ? "" : p;
}

// Whether symbolic link `target`, found at member `member`, resolves inside the archive.
bool LinkStaysInside(const std::string& member, const std::string& target) {
  if (target.empty() || target.front() == '/') return false;
  std::vector<std::string> parts = absl::StrSplit(member, '/');
  parts.pop_back();  // the link's directory
  for (absl::string_view c : absl::StrSplit(target, '/')) {
    if (c.empty() || c == ".") continue;
    if (c == "..") {
      if (parts.empty()) return false;
      parts.pop_back();
    } else {
      parts.emplace_back(c);
    }
  }
  return true;
}

Reader OpenForReading(const std::string& path, absl::Status* error) {
  Reader a(archive_read_new());
  archive_read_support_filter_gzip(a.get());
  archive_read_support_format_tar(a.get());
  if (archive_read_open_filename(a.get(), path.c_str(), 1 << 16) != ARCHIVE_OK) {
    *error = absl::InvalidArgumentError(
        absl::StrCat("the source archive is not a tar.gz archive: ", ErrorOf(a.get())));
    return nullptr;
  }
  return a;
}

// Checks one member; counts it into `summary`. `links`: the symbolic links met so far (a member
// under one would be written through it, which unpacking refuses: refused here, at submission).
absl::Status CheckMember(archive_entry* e, ArchiveSummary* summary, int64_t* entries,
                         absl::flat_hash_set<std::string>* links) {
  const std::string path = MemberPath(archive_entry_pathname(e));
  if (++*entries > kMaxSourceEntries) {
    return absl::InvalidArgumentError(
        absl::StrCat("the source archive has more than ", kMaxSourceEntries, " members"));
  }
  if (path.empty()) return absl::OkStatus();  // "./": the root
  if (absl::Status s = ValidateRelativePath(absl::StrCat("source archive member"), path); !s.ok()) {
    return s;
  }
  for (size_t slash = path.find('/'); slash != std::string::npos;
       slash = path.find('/', slash + 1)) {
    if (links->contains(path.substr(0, slash))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "source archive member '", path, "' lies under '", path.substr(0, slash),
          "', a symbolic link in the archive: it would be unpacked through the link (pack the "
          "directory the link points to instead, or the link alone)"));
    }
  }
  if (const char* hard = archive_entry_hardlink(e); hard != nullptr) {
    return ValidateRelativePath(
        absl::StrCat("source archive member '", path, "' (a hard link) target"), MemberPath(hard));
  }
  switch (archive_entry_filetype(e)) {
    case AE_IFREG:
      summary->files += 1;
      summary->unpacked_bytes += archive_entry_size(e);
      if (summary->unpacked_bytes > kMaxSourceUnpackedBytes) {
        return absl::InvalidArgumentError(absl::StrCat("the source archive unpacks to more than ",
                                                       kMaxSourceUnpackedBytes,
                                                       " bytes (at member '", path, "')"));
      }
      return absl::OkStatus();
    case AE_IFDIR:
      return absl::OkStatus();
    case AE_IFLNK: {
      const char* target = archive_entry_symlink(e);
      if (target == nullptr || !LinkStaysInside(path, target)) {
        return absl::InvalidArgumentError(
            absl::StrCat("source archive member '", path, "' is a symbolic link to '",
                         target != nullptr ? target : "", "', outside the archive"));
      }
      if (links->size() < static_cast<size_t>(kMaxSourceEntries)) links->insert(path);
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("source archive member '", path,
                       "' is not a regular file, a directory or a symbolic link"));
  }
}

}  // namespace

absl::Status ValidateRelativePath(absl::string_view field, absl::string_view path) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(field, " '", absl::CEscape(path), "' ", why));
  };
  if (path.empty()) return bad("is empty");
  if (path.size() > 4096) return bad("is longer than 4096 bytes");
  if (path.front() == '/') return bad("is not a relative path");
  if (path.find('\0') != absl::string_view::npos) return bad("contains a NUL byte");
  for (absl::string_view c : absl::StrSplit(path, '/')) {
    if (c.empty()) return bad("has an empty component");
    if (c == "." || c == "..") return bad("has a '.' or '..' component");
    if (c.size() > 255) return bad("has a component longer than 255 bytes");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> PackDirectory(const std::string& dir, int64_t max_bytes) {
  std::error_code error;
  if (!fs::is_directory(dir, error)) {
    return absl::InvalidArgumentError(
        absl::StrCat("source directory ", dir, " is not a directory"));
  }
  std::vector<fs::path> paths;
  for (auto it = fs::recursive_directory_iterator(dir, error);
       !error && it != fs::recursive_directory_iterator(); it.increment(error)) {
    paths.push_back(it->path());
  }
  if (error) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read source directory ", dir, ": ", error.message()));
  }
  std::sort(paths.begin(), paths.end());  // the same tree packs the same way

  struct Sink {
    std::string data;
    int64_t max_bytes;
    bool over = false;
  } sink{"", max_bytes};
  Writer a(archive_write_new());
  archive_write_add_filter_gzip(a.get());
  archive_write_set_format_pax_restricted(a.get());
  archive_write_set_bytes_in_last_block(a.get(), 1);
  auto write = [](archive*, void* data, const void* buffer, size_t n) -> la_ssize_t {
    Sink* s = static_cast<Sink*>(data);
    if (static_cast<int64_t>(s->data.size() + n) > s->max_bytes) {
      s->over = true;
      return -1;
    }
    s->data.append(static_cast<const char*>(buffer), n);
    return static_cast<la_ssize_t>(n);
  };
  auto too_big = [&] {
    return absl::InvalidArgumentError(absl::StrCat("source directory ", dir,
                                                   " packs to more than the limit of ", max_bytes,
                                                   " bytes (a tar.gz archive)"));
  };
  if (archive_write_open(a.get(), &sink, nullptr, write, nullptr) != ARCHIVE_OK) {
    return absl::InternalError(absl::StrCat("cannot start the archive: ", ErrorOf(a.get())));
  }
  std::vector<char> buffer(1 << 16);
  for (const fs::path& p : paths) {
    struct stat st;
    if (lstat(p.c_str(), &st) != 0) continue;  // vanished meanwhile
    const std::string rel = p.lexically_relative(dir).generic_string();
    std::unique_ptr<archive_entry, EntryFree> e(archive_entry_new());
    archive_entry_set_pathname(e.get(), rel.c_str());
    archive_entry_set_perm(e.get(), st.st_mode & 0777);
    archive_entry_set_mtime(e.get(), st.st_mtime, 0);
    std::string target;
    if (S_ISREG(st.st_mode)) {
      archive_entry_set_filetype(e.get(), AE_IFREG);
      archive_entry_set_size(e.get(), st.st_size);
    } else if (S_ISDIR(st.st_mode)) {
      archive_entry_set_filetype(e.get(), AE_IFDIR);
    } else if (S_ISLNK(st.st_mode)) {
      target.resize(static_cast<size_t>(st.st_size) + 1);
      const ssize_t n = readlink(p.c_str(), target.data(), target.size());
      if (n < 0) continue;
      target.resize(static_cast<size_t>(n));
      archive_entry_set_filetype(e.get(), AE_IFLNK);
      archive_entry_set_symlink(e.get(), target.c_str());
    } else {
      continue;  // sockets, pipes and devices are not code
    }
    if (archive_write_header(a.get(), e.get()) != ARCHIVE_OK) {
      if (sink.over) return too_big();
      return absl::InternalError(absl::StrCat("cannot archive ", rel, ": ", ErrorOf(a.get())));
    }
    if (S_ISREG(st.st_mode)) {
      std::ifstream in(p, std::ios::binary);
      while (in) {
        in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
        if (in.gcount() <= 0) break;
        if (archive_write_data(a.get(), buffer.data(), static_cast<size_t>(in.gcount())) < 0) {
          if (sink.over) return too_big();
          return absl::InternalError(absl::StrCat("cannot archive ", rel, ": ", ErrorOf(a.get())));
        }
      }
    }
  }
  if (archive_write_close(a.get()) != ARCHIVE_OK || sink.over) {
    if (sink.over) return too_big();
    return absl::InternalError(absl::StrCat("cannot finish the archive: ", ErrorOf(a.get())));
  }
  return std::move(sink.data);
}

absl::StatusOr<ArchiveSummary> InspectArchive(const std::string& path) {
  absl::Status error;
  Reader a = OpenForReading(path, &error);
  if (a == nullptr) return error;
  ArchiveSummary summary;
  int64_t entries = 0;
  absl::flat_hash_set<std::string> links;
  archive_entry* e = nullptr;
  while (true) {
    const int r = archive_read_next_header(a.get(), &e);
    if (r == ARCHIVE_EOF) break;
    if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {
      return absl::InvalidArgumentError(
          absl::StrCat("the source archive is not a valid tar.gz archive: ", ErrorOf(a.get())));
    }
    if (absl::Status s = CheckMember(e, &summary, &entries, &links); !s.ok()) return s;
    // Reading the data (not skipping it) finds a truncated or corrupt archive here.
    const void* block;
    size_t size;
    la_int64_t offset;
    int d;
    while ((d = archive_read_data_block(a.get(), &block, &size, &offset)) == ARCHIVE_OK) {
    }
    if (d != ARCHIVE_EOF) {
      return absl::InvalidArgumentError(
          absl::StrCat("the source archive is corrupt: ", ErrorOf(a.get())));
    }
  }
  return summary;
}

absl::Status ExtractArchive(const std::string& path, const std::string& dest) {
  if (absl::StatusOr<ArchiveSummary> checked = InspectArchive(path); !checked.ok()) {
    return checked.status();
  }
  std::error_code error;
  fs::create_directories(dest, error);
  if (error) {
    return absl::UnavailableError(absl::StrCat("cannot create ", dest, ": ", error.message()));
  }
  absl::Status open_error;
  Reader in = OpenForReading(path, &open_error);
  if (in == nullptr) return open_error;
  Writer out(archive_write_disk_new());
  // Members were checked to be relative (InspectArchive) and are written under `dest` by absolute
  // path; libarchive also refuses ".." and writing through a symbolic link.
  archive_write_disk_set_options(out.get(), ARCHIVE_EXTRACT_TIME | ARCHIVE_EXTRACT_PERM |
                                                ARCHIVE_EXTRACT_SECURE_SYMLINKS |
                                                ARCHIVE_EXTRACT_SECURE_NODOTDOT);
  archive_entry* e = nullptr;
  while (archive_read_next_header(in.get(), &e) == ARCHIVE_OK) {
    const std::string member = MemberPath(archive_entry_pathname(e));
    if (member.empty()) continue;
    const std::string target = absl::StrCat(dest, "/", member);
    archive_entry_set_pathname(e, target.c_str());
    if (const char* hard = archive_entry_hardlink(e); hard != nullptr) {
      const std::string linked = absl::StrCat(dest, "/", MemberPath(hard));
      archive_entry_set_hardlink(e, linked.c_str());
    }
    archive_entry_set_perm(e, archive_entry_perm(e) & 0777);  // no set-uid bits
    if (archive_write_header(out.get(), e) != ARCHIVE_OK) {
      return absl::UnavailableError(
          absl::StrCat("cannot unpack '", member, "' into ", dest, ": ", ErrorOf(out.get())));
    }
    const void* block;
    size_t size;
    la_int64_t offset;
    int r;
    while ((r = archive_read_data_block(in.get(), &block, &size, &offset)) == ARCHIVE_OK) {
      if (archive_write_data_block(out.get(), block, size, offset) != ARCHIVE_OK) {
        return absl::UnavailableError(
            absl::StrCat("cannot write '", member, "' into ", dest, ": ", ErrorOf(out.get())));
      }
    }
    if (r != ARCHIVE_EOF) {
      return absl::InvalidArgumentError(
          absl::StrCat("the source archive is corrupt at '", member, "': ", ErrorOf(in.get())));
    }
    if (archive_write_finish_entry(out.get()) != ARCHIVE_OK) {
      return absl::UnavailableError(
          absl::StrCat("cannot finish '", member, "' in ", dest, ": ", ErrorOf(out.get())));
    }
  }
  if (archive_write_close(out.get()) != ARCHIVE_OK) {
    return absl::UnavailableError(
        absl::StrCat("cannot finish unpacking into ", dest, ": ", ErrorOf(out.get())));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Sha256OfFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::UnavailableError(absl::StrCat("cannot read ", path));
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr);
  std::vector<char> buffer(1 << 16);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    if (in.gcount() > 0)
      EVP_DigestUpdate(ctx.get(), buffer.data(), static_cast<size_t>(in.gcount()));
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &size);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(digest), size));
}

}  // namespace ringmaster
