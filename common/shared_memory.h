// Anonymous shared memory (memfd), mapped once: the arena that holds a job's tensors for a training
// process and its worker daemon. It has no name in /dev/shm, so nothing is left behind whoever
// dies: the daemon passes the descriptor to the training process over the local socket
// (SCM_RIGHTS), and the memory is freed when the last mapping and descriptor are gone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace ringmaster {

class SharedMemory {
 public:
  // Creates `bytes` of shared memory (`name` is for /proc/PID/fd listings only) and maps it.
  static absl::StatusOr<std::unique_ptr<SharedMemory>> Create(const std::string& name,
                                                              size_t bytes);
  // Maps the memory behind `fd` (received from its creator); takes ownership of `fd`.
  static absl::StatusOr<std::unique_ptr<SharedMemory>> Map(int fd, std::string name);
  ~SharedMemory();

  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;

  uint8_t* data() const { return data_; }
  // The descriptor to pass to another process; owned by this object.
  int fd() const { return fd_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  SharedMemory(std::string name, int fd, uint8_t* data, size_t size)
      : name_(std::move(name)), fd_(fd), data_(data), size_(size) {}

  const std::string name_;
  const int fd_;
  uint8_t* const data_;
  const size_t size_;
};

// First-fit allocator of offsets in [begin, end) of an arena, 64-byte aligned. Thread-safe.
class ArenaAllocator {
 public:
  static constexpr size_t kAlignment = 64;

  ArenaAllocator(size_t begin, size_t end);

  // The offset of `bytes` (at least 1) free bytes, or RESOURCE_EXHAUSTED saying how much is free.
  absl::StatusOr<size_t> Allocate(size_t bytes);
  // INVALID_ARGUMENT when `offset` was not allocated (or already freed).
  absl::Status Free(size_t offset);

  size_t free_bytes() const;
  bool Contains(size_t offset) const { return offset >= begin_ && offset < end_; }
  size_t end() const { return end_; }

 private:
  const size_t begin_;
  const size_t end_;
  mutable absl::Mutex mu_;
  std::map<size_t, size_t> free_ ABSL_GUARDED_BY(mu_);  // offset -> bytes, coalesced
  std::map<size_t, size_t> used_ ABSL_GUARDED_BY(mu_);  // offset -> bytes
};

}  // namespace ringmaster
