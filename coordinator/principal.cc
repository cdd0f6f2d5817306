#include "coordinator/principal.h"

#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "spdlog/spdlog.h"

namespace ringmaster {
namespace {

// One CSV record: fields split at commas outside double quotes; quotes removed.
std::vector<std::string> SplitCsv(absl::string_view line) {
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (char c : line) {
    if (c == '"') {
      quoted = !quoted;
    } else if (c == ',' && !quoted) {
      fields.emplace_back();
    } else {
      fields.back().push_back(c);
    }
  }
  for (std::string& f : fields) f = std::string(absl::StripAsciiWhitespace(f));
  return fields;
}

// The file's contents; nullopt when it cannot be read.
std::optional<std::string> ReadWhole(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

int64_t ModifiedNs(const struct stat& st) {
  return int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec;
}

}  // namespace

Principal Principal::Anonymous() {
  return Principal{.name = "", .groups = {}, .admin = true, .worker = true, .via = "none"};
}

std::string Principal::Describe() const {
  if (via == "none") return "the anonymous operator";
  return absl::StrCat(worker && !admin ? "worker '" : "user '", name, "'");
}

bool Principal::InGroup(absl::string_view group) const {
  return std::find(groups.begin(), groups.end(), group) != groups.end();
}

std::vector<std::string> OrganizationsOf(absl::string_view subject) {
  std::vector<std::string> out;
  std::string part;
  auto take = [&] {
    absl::string_view p = absl::StripAsciiWhitespace(part);
    if (p.size() > 2 && (p[0] == 'O' || p[0] == 'o') && p[1] == '=') out.emplace_back(p.substr(2));
    part.clear();
  };
  for (size_t i = 0; i < subject.size(); ++i) {
    const char c = subject[i];
    if (c == '\\' && i + 1 < subject.size()) {
      part.push_back(subject[++i]);
    } else if (c == ',' || c == '+') {
      take();
    } else {
      part.push_back(c);
    }
  }
  take();
  return out;
}

absl::StatusOr<absl::flat_hash_map<std::string, TokenEntry>> ParseTokenFile(
    absl::string_view text) {
  absl::flat_hash_map<std::string, TokenEntry> tokens;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> fields = SplitCsv(line);
    if (fields.size() < 3 || fields[0].empty() || fields[1].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", number,
                       ": expected token,user,uid[,\"group1,group2\"] with a token and a user"));
    }
    TokenEntry entry{.user = fields[1], .uid = fields[2], .groups = {}};
    for (size_t i = 3; i < fields.size(); ++i) {
      for (absl::string_view g : absl::StrSplit(fields[i], ',', absl::SkipWhitespace())) {
        entry.groups.emplace_back(absl::StripAsciiWhitespace(g));
      }
    }
    if (!tokens.emplace(fields[0], std::move(entry)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", number, ": the token of user '", fields[1], "' is given twice"));
    }
  }
  return tokens;
}

absl::StatusOr<std::unique_ptr<TokenFile>> TokenFile::Open(std::string path,
                                                           absl::Duration recheck) {
  std::unique_ptr<TokenFile> file(new TokenFile(std::move(path), recheck));
  struct stat st {};
  const bool stated = ::stat(file->path_.c_str(), &st) == 0;
  const std::optional<std::string> text = ReadWhole(file->path_);
  if (!text.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--token-file ", file->path_, ": cannot be read"));
  }
  absl::StatusOr<absl::flat_hash_map<std::string, TokenEntry>> tokens = ParseTokenFile(*text);
  if (!tokens.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--token-file ", file->path_, ": ", tokens.status().message()));
  }
  absl::MutexLock lock(&file->mu_);
  if (stated) {
    file->mtime_ns_ = ModifiedNs(st);
    file->size_ = st.st_size;
  }
  file->tokens_ = *std::move(tokens);
  file->checked_ = absl::Now();
  return file;
}

absl::StatusOr<TokenEntry> TokenFile::Lookup(absl::string_view token) {
  bool recheck;
  {
    absl::MutexLock lock(&mu_);
    recheck = absl::Now() - checked_ >= recheck_;
    if (recheck) checked_ = absl::Now();
  }
  if (recheck) Reload();
  absl::MutexLock lock(&mu_);
  auto it = tokens_.find(token);
  if (it == tokens_.end()) return absl::NotFoundError("no such token");
  return it->second;
}

void TokenFile::Reload() {
  // The file is read with the lock released (a slow disk must not hold up other calls); two calls
  // that both reload store the same contents.
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0) return;  // gone for a moment (being replaced): keep it
  const int64_t mtime_ns = ModifiedNs(st);
  {
    absl::MutexLock lock(&mu_);
    if (mtime_ns == mtime_ns_ && st.st_size == size_) return;
  }
  // Unreadable for a moment (its mode being changed): keep what was read, try again later.
  const std::optional<std::string> text = ReadWhole(path_);
  if (!text.has_value()) return;
  absl::StatusOr<absl::flat_hash_map<std::string, TokenEntry>> tokens = ParseTokenFile(*text);
  absl::MutexLock lock(&mu_);
  mtime_ns_ = mtime_ns;
  size_ = st.st_size;
  if (!tokens.ok()) {
    spdlog::error("token file {} not reloaded, keeping its last good contents: {}", path_,
                  std::string(tokens.status().message()));
    return;
  }
  tokens_ = *std::move(tokens);
  spdlog::info("token file {} reloaded: {} tokens", path_, tokens_.size());
}

}  // namespace ringmaster
