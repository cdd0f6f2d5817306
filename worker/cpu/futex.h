// Futex waits and wakes on 32-bit words that may lie in memory shared between processes (so not
// FUTEX_PRIVATE), and a spin-loop pause.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdint>

#include "absl/time/time.h"

namespace ringmaster {

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));

inline void FutexWake(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Sleeps while `word` holds `expected`, for at most `wait` (and may wake early).
inline void FutexWait(std::atomic<uint32_t>& word, uint32_t expected, absl::Duration wait) {
  const timespec ts = absl::ToTimespec(wait);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace ringmaster
