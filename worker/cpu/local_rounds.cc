#include "worker/cpu/local_rounds.h"

#include <algorithm>

#include "absl/time/clock.h"
#include "worker/cpu/futex.h"

namespace ringmaster {
namespace {

// The word: lists (12 bits) | rounds (12) | cache id (24) | diverted (1) | mask of ranks (15).
constexpr int kIdShift = 16;
constexpr int kPointShift = 40;
constexpr uint32_t kPointField = 0xFFF;
constexpr uint64_t kMaskBits = (uint64_t{1} << LocalRoundState::kMaxRanks) - 1;
constexpr uint64_t kDiverted = uint64_t{1} << LocalRoundState::kMaxRanks;
static_assert(LocalRoundState::kMaxRanks + 1 == kIdShift);
static_assert(kIdShift + 24 == kPointShift);

uint32_t Pack(LocalPoint p) {
  return static_cast<uint32_t>(((p.lists & kPointField) << 12) | (p.rounds & kPointField));
}
uint32_t PointOf(uint64_t word) { return static_cast<uint32_t>(word >> kPointShift); }
uint32_t IdOf(uint64_t word) { return static_cast<uint32_t>(word >> kIdShift) & 0xFFFFFF; }
uint64_t MaskOf(uint64_t word) { return word & kMaskBits; }
bool DivertedAt(uint64_t word) { return (word & kDiverted) != 0; }
uint64_t Make(uint32_t point, uint32_t id, uint64_t bits) {
  return (uint64_t{point} << kPointShift) | (uint64_t{id} << kIdShift) | bits;
}

// Spins this many times looking at the word before sleeping: ranks in step post within
// microseconds of each other, and a futex sleep and wake costs tens. A wake (more work) ends it.
constexpr int kSpins = 2000;

}  // namespace

LocalRounds::LocalRounds(LocalRoundState* state, int rank, int size)
    : state_(state),
      rank_(rank),
      size_(std::clamp(size, 1, LocalRoundState::kMaxRanks)),
      me_(uint64_t{1} << rank),
      full_((uint64_t{1} << size_) - 1) {}

LocalRounds::Seen LocalRounds::Classify(uint64_t word, uint32_t point) const {
  if (PointOf(word) == point) {
    if (MaskOf(word) == full_) return Seen::kCompleted;
    if (DivertedAt(word) || (word & me_) == 0) return Seen::kDiverted;
    return Seen::kWaiting;
  }
  // Rounds only complete with every rank: a word whose round count is one on from ours was
  // written by a rank past our round, which completed.
  return ((PointOf(word) - point) & kPointField) == 1 ? Seen::kCompleted : Seen::kDiverted;
}

bool LocalRounds::DivertedBySomeone(uint32_t point) const {
  for (int r = 0; r < size_; ++r) {
    if (state_->diverted_at[r].load() == point + 1) return true;
  }
  return false;
}

void LocalRounds::WakeAll(uint64_t mask) {
  for (int r = 0; mask != 0; ++r, mask >>= 1) {
    if ((mask & 1) == 0) continue;
    state_->wake[r].seq.fetch_add(1, std::memory_order_release);
    FutexWake(state_->wake[r].seq);
  }
}

void LocalRounds::Wake() { WakeAll(me_); }

LocalRounds::Outcome LocalRounds::Join(LocalPoint at, uint32_t id, absl::Time deadline,
                                       absl::FunctionRef<bool()> give_up) {
  const uint32_t point = Pack(at);
  if (DivertedBySomeone(point)) return Outcome::kDiverted;
  std::atomic<uint64_t>& word = state_->word;
  uint64_t w = word.load();
  while (true) {
    uint64_t next;
    const uint64_t mask = MaskOf(w);
    if (PointOf(w) == point) {
      if (DivertedAt(w)) return Outcome::kDiverted;
      if (mask != 0 && IdOf(w) != id) {  // another collective: none of us may complete it here
        if (word.compare_exchange_weak(w, w | kDiverted)) {
          WakeAll(mask);
          return Outcome::kDiverted;
        }
        continue;
      }
      next = mask == 0 ? Make(point, id, me_) : w | me_;
    } else {
      // Another point's round. One still open there means the ranks are out of step (one has
      // processed a list another has not): neither round can complete, so both go to the
      // coordinator, which orders them again.
      if (mask != 0 && mask != full_ && !DivertedAt(w)) {
        if (word.compare_exchange_weak(w, w | kDiverted)) {
          WakeAll(mask);
          return Outcome::kDiverted;
        }
        continue;
      }
      next = Make(point, id, me_);
    }
    if (word.compare_exchange_weak(w, next)) {
      if (MaskOf(next) == full_) {  // the commit: every rank is in
        WakeAll(full_ & ~me_);
        return Outcome::kCompleted;
      }
      break;
    }
  }
  // Wait. The wake count is read before the word, so a change after the read ends the sleep.
  std::atomic<uint32_t>& seq = state_->wake[rank_].seq;
  const uint32_t first = seq.load(std::memory_order_acquire);
  for (int spins = 0;; ++spins) {
    const uint32_t s = seq.load(std::memory_order_acquire);
    w = word.load();
    switch (Classify(w, point)) {
      case Seen::kCompleted:
        return Outcome::kCompleted;
      case Seen::kDiverted:
        return Outcome::kDiverted;
      case Seen::kWaiting:
        break;
    }
    // Read after posting: a rank that marked this point before our post, having found no round
    // to divert, is seen here.
    bool leave = DivertedBySomeone(point);
    if (!leave && spins < kSpins && s == first) {
      CpuRelax();
      continue;
    }
    const absl::Time now = absl::Now();
    leave = leave || now >= deadline || give_up();
    if (leave) {
      // Leave, unless the round completed meanwhile (the commit cannot be undone).
      if (word.compare_exchange_strong(w, w | kDiverted)) {
        WakeAll(MaskOf(w) & ~me_);
        return Outcome::kDiverted;
      }
      continue;
    }
    FutexWait(seq, s, std::min(deadline - now, absl::Milliseconds(10)));
  }
}

void LocalRounds::Divert(LocalPoint at) {
  const uint32_t point = Pack(at);
  state_->diverted_at[rank_].store(point + 1);
  // An open round, here (it cannot complete now) or at another point (out of step), is diverted
  // so that its waiters wake and go to the coordinator too.
  std::atomic<uint64_t>& word = state_->word;
  uint64_t w = word.load();
  while (true) {
    const uint64_t mask = MaskOf(w);
    if (mask == 0 || mask == full_ || DivertedAt(w)) return;
    if (word.compare_exchange_weak(w, w | kDiverted)) {
      WakeAll(mask);
      return;
    }
  }
}

}  // namespace ringmaster
