// Local negotiation: the daemons of a job whose ranks all share one host agree on a lone cached
// allreduce through shared memory, without the coordinator's round trip (two gRPC hops and the
// wake-ups behind them, most of a small allreduce's latency).
//
// When a rank has exactly one collective to negotiate, nothing else awaits a response, and the
// collective is in its response cache, it joins a *round* instead of sending the request: it
// posts the cache id in one shared 64-bit word. (A collective under one of Horovod's automatic
// names, new every call, posts the id of its family's last cached name with the same metadata.)
// Once every rank of the job posted the same id at the same point, the round is complete and every
// rank executes the response the coordinator would have sent (its cache entry says what it is), in
// the same place in its sequence. Anything else diverts the round, and each rank then sends its
// request to the coordinator as before:
//   - a rank sent requests to the coordinator at this point (it was not quiet: its requests
//     outstanding there need the others' too), or posted another id;
//   - a rank had more work meanwhile (another collective, a response list), or waited too long;
//   - ranks are out of step (one processed a list the other has not yet).
// The coordinator does not negotiate a completed round (it hears only, with the rank's next batch,
// that the cache entry was used): it negotiates only what is sent to it, so whatever goes through
// it and through rounds stays in one order on every rank.
//
// A rank's point is (response lists processed, rounds completed): equal on every rank that has
// nothing awaiting a response, since every list goes to every rank and every round completes on
// all. A round is identified by its point; its word holds the point (12 bits each, as only nearby
// points ever meet), the cache id (24 bits), whether it is diverted, and a mask of the ranks that
// joined (at most kMaxRanks). A full mask completes it: that compare-and-swap is the commit, and
// no rank can leave a round after it (leaving is a compare-and-swap that marks it diverted). A rank
// that waits sees its round complete as a full mask at its point, or as a word whose round count
// moved on by one (no round can complete without every rank). A rank that sends to the coordinator
// also leaves a marker of its own, the point it sent at, so a rank that comes to that point later
// goes to the coordinator at once, whatever the shared word holds by then.
//
// Thread-safe; LocalRoundState may lie in memory shared between processes.
#pragma once

#include <atomic>
#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/time/time.h"

namespace ringmaster {

// The shared part, zero-initialised. Each rank sleeps on its own wake word.
struct LocalRoundState {
  static constexpr int kMaxRanks = 15;
  alignas(64) std::atomic<uint64_t> word;
  // Per rank: 1 + the (packed) point at which it last sent to the coordinator; 0: never.
  alignas(64) std::atomic<uint32_t> diverted_at[kMaxRanks];
  struct alignas(64) Wake {
    std::atomic<uint32_t> seq;
  };
  Wake wake[kMaxRanks];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);

// Where a rank stands: response lists processed and rounds completed, as the engine counts them.
struct LocalPoint {
  uint64_t lists = 0;
  uint64_t rounds = 0;
};

class LocalRounds {
 public:
  static constexpr uint32_t kMaxId = 0xFFFFFF;  // larger cache ids go to the coordinator

  // `rank` among `size` ranks (2..kMaxRanks); `state` is borrowed.
  LocalRounds(LocalRoundState* state, int rank, int size);

  enum class Outcome { kCompleted, kDiverted };
  // Joins the round at `point` for cache id `id` (1..kMaxId) and waits until it completes or is
  // diverted. Gives up (diverting the round, unless it completed meanwhile) once `deadline` passes
  // or `give_up()` returns true; that is checked whenever the wait wakes: Wake() wakes it.
  Outcome Join(LocalPoint point, uint32_t id, absl::Time deadline,
               absl::FunctionRef<bool()> give_up);
  // This rank sends requests to the coordinator at `point` (or has some awaiting a response
  // there): no round completes at it, and ranks waiting in one give up at once.
  void Divert(LocalPoint point);
  // Wakes this rank's Join (from another thread: it has more work).
  void Wake();

 private:
  enum class Seen { kWaiting, kCompleted, kDiverted };
  // What `word` means for a rank that joined the round at `point`.
  Seen Classify(uint64_t word, uint32_t point) const;
  // Whether a rank sent to the coordinator at `point`.
  bool DivertedBySomeone(uint32_t point) const;
  void WakeAll(uint64_t mask);

  LocalRoundState* const state_;
  const int rank_;
  const int size_;
  const uint64_t me_;
  const uint64_t full_;
};

}  // namespace ringmaster
