#include "coordinator/log_journal.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "spdlog/spdlog.h"

namespace ringmaster {
namespace {

// "R <rank> <stream> <seq> <unix us> <bytes>\n" then the bytes and "\n".
std::string Encode(const JournalRecord& r) {
  return absl::StrCat("R ", r.rank, " ", r.stream, " ", r.seq, " ", absl::ToUnixMicros(r.time), " ",
                      r.data.size(), "\n", r.data, "\n");
}

}  // namespace

absl::StatusOr<std::unique_ptr<LogJournal>> LogJournal::Open(std::string dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("cannot create the logs directory ", dir, ": ", error.message()));
  }
  return std::unique_ptr<LogJournal>(new LogJournal(std::move(dir)));
}

LogJournal::~LogJournal() = default;

std::string LogJournal::PathOf(const std::string& job_id) const {
  return absl::StrCat(dir_, "/", job_id, ".log");
}

std::FILE* LogJournal::FileOf(const std::string& job_id) {
  File& file = files_[job_id];
  if (file.f == nullptr) {
    file.f.reset(std::fopen(PathOf(job_id).c_str(), "ae"));
    if (file.f == nullptr) {
      spdlog::error("cannot open {}: {}; the job's output is not kept across a restart",
                    PathOf(job_id), std::strerror(errno));
      return nullptr;
    }
    std::error_code error;
    file.bytes = static_cast<int64_t>(std::filesystem::file_size(PathOf(job_id), error));
  }
  return file.f.get();
}

void LogJournal::Load(
    const std::function<void(const std::string& job_id, JournalRecord record)>& each) {
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir_, error)) {
    const std::string name = entry.path().filename().string();
    if (!absl::EndsWith(name, ".log")) continue;
    const std::string job_id = name.substr(0, name.size() - 4);
    std::ifstream in(entry.path(), std::ios::binary);
    std::error_code size_error;
    const uint64_t size = std::filesystem::file_size(entry.path(), size_error);
    std::string header;
    uint64_t good = 0;  // the end of the last whole record
    while (std::getline(in, header)) {
      std::vector<std::string> f = absl::StrSplit(header, ' ');
      JournalRecord r;
      int64_t us = 0;
      size_t bytes = 0;
      if (f.size() != 6 || f[0] != "R" || !absl::SimpleAtoi(f[1], &r.rank) ||
          !absl::SimpleAtoi(f[2], &r.stream) || !absl::SimpleAtoi(f[3], &r.seq) ||
          !absl::SimpleAtoi(f[4], &us) || !absl::SimpleAtoi(f[5], &bytes)) {
        break;
      }
      if (bytes > size) break;  // damaged: no such record fits in the file
      r.time = absl::FromUnixMicros(us);
      r.data.resize(bytes);
      if (!in.read(r.data.data(), static_cast<std::streamsize>(bytes)) || in.get() != '\n') {
        break;  // cut short: written as the coordinator died
      }
      good = static_cast<uint64_t>(in.tellg());
      each(job_id, std::move(r));
    }
    if (!size_error && good < size) {
      spdlog::warn("{}: {} bytes after the last whole record are dropped", entry.path().string(),
                   size - good);
      std::filesystem::resize_file(entry.path(), good, size_error);
    }
  }
}

int64_t LogJournal::Write(const std::string& job_id, const JournalRecord& record) {
  std::FILE* f = FileOf(job_id);
  if (f == nullptr) return 0;
  const std::string bytes = Encode(record);
  // Flushed at once: the process may die the next moment; the kernel keeps what was written.
  if (std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() || std::fflush(f) != 0) {
    spdlog::error("cannot write {}: {}", PathOf(job_id), std::strerror(errno));
  }
  File& file = files_[job_id];
  file.bytes += static_cast<int64_t>(bytes.size());
  return file.bytes;
}

void LogJournal::Rewrite(const std::string& job_id, const std::vector<JournalRecord>& records) {
  files_.erase(job_id);
  const std::string path = PathOf(job_id), fresh = path + ".new";
  std::FILE* f = std::fopen(fresh.c_str(), "we");
  if (f == nullptr) return;
  bool written = true;
  for (const JournalRecord& r : records) {
    const std::string bytes = Encode(r);
    written = written && std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  }
  written = std::fclose(f) == 0 && written;
  std::error_code error;
  if (!written) {  // a full disk: the old file (longer, but whole) stays
    spdlog::error("cannot rewrite {}: {}", path, std::strerror(errno));
    std::filesystem::remove(fresh, error);
    return;
  }
  std::filesystem::rename(fresh, path, error);  // atomic: a crash leaves the old file or the new
}

void LogJournal::Close(const std::string& job_id) { files_.erase(job_id); }

void LogJournal::Remove(const std::string& job_id) {
  files_.erase(job_id);
  std::error_code error;
  std::filesystem::remove(PathOf(job_id), error);
}

}  // namespace ringmaster
