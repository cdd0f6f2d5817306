#include "common/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ringmaster {
namespace {

absl::Status Errno(absl::string_view what, const std::string& name) {
  return absl::UnavailableError(absl::StrCat(what, " ", name, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<SharedMemory>> SharedMemory::Create(const std::string& name,
                                                                   size_t bytes) {
  int fd = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0) return Errno("memfd_create", name);
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    absl::Status s = Errno("ftruncate", name);
    close(fd);
    return s;
  }
  return Map(fd, name);
}

absl::StatusOr<std::unique_ptr<SharedMemory>> SharedMemory::Map(int fd, std::string name) {
  struct stat st;
  if (fstat(fd, &st) != 0) {
    absl::Status s = Errno("fstat", name);
    close(fd);
    return s;
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    absl::Status s = Errno("mmap", name);
    close(fd);
    return s;
  }
  return std::unique_ptr<SharedMemory>(
      new SharedMemory(std::move(name), fd, static_cast<uint8_t*>(data), bytes));
}

SharedMemory::~SharedMemory() {
  munmap(data_, size_);
  close(fd_);
}

ArenaAllocator::ArenaAllocator(size_t begin, size_t end) : begin_(begin), end_(end) {
  if (end > begin) free_[begin] = end - begin;
}

absl::StatusOr<size_t> ArenaAllocator::Allocate(size_t bytes) {
  const size_t want = ((bytes == 0 ? 1 : bytes) + kAlignment - 1) / kAlignment * kAlignment;
  absl::MutexLock lock(&mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < want) continue;
    const size_t offset = it->first;
    const size_t left = it->second - want;
    free_.erase(it);
    if (left > 0) free_[offset + want] = left;
    used_[offset] = want;
    return offset;
  }
  size_t total = 0;
  for (const auto& [o, b] : free_) total += b;
  return absl::ResourceExhaustedError(
      absl::StrCat("shared arena full: ", bytes, " bytes requested, ", total, " free"));
}

absl::Status ArenaAllocator::Free(size_t offset) {
  absl::MutexLock lock(&mu_);
  auto it = used_.find(offset);
  if (it == used_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("offset ", offset, " is not allocated"));
  }
  size_t start = offset, bytes = it->second;
  used_.erase(it);
  auto next = free_.lower_bound(start);
  if (next != free_.end() && start + bytes == next->first) {
    bytes += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      bytes += prev->second;
      free_.erase(prev);
    }
  }
  free_[start] = bytes;
  return absl::OkStatus();
}

size_t ArenaAllocator::free_bytes() const {
  absl::MutexLock lock(&mu_);
  size_t total = 0;
  for (const auto& [o, b] : free_) total += b;
  return total;
}

}  // namespace ringmaster
