// Who is slow: each rank's lateness to the job's collectives, step by step, from when the ranks
// asked for them (the negotiator hands it the ranks' requests for every kSampleEvery-th tensor of a
// step, the step's first included: the hot path stays a branch for the others). For a tensor, a
// rank's lateness is the time from the first rank's request to its own; a rank's lateness in a step
// is the largest over the step's sampled tensors. The last `window` steps of every rank are kept
// (window x ranks values, bounded however long the job runs), and Window() says, over them, each
// rank's median lateness per step behind the first rank and behind the median rank, and names the
// rank that held the job back.
//
// A step ends where a tensor is asked for again that was already asked for in it: a training loop
// negotiates the same tensors every step, and a rank asks for the next step's only after the last
// step's are done, so the first tensor asked for twice begins the next step (one-off tensors
// before the loop, an init's allgather or a broadcast of the parameters, count in the first
// step). Or after kMaxStepTensors tensors (a loop whose names never repeat).
//
// Not thread-safe: its owner serialises the calls (the negotiator, under its lock). Time is passed
// in.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/time/time.h"

namespace ringmaster {

class StragglerTracker {
 public:
  static constexpr int kDefaultWindow = 10;
  static constexpr int64_t kMaxStepTensors = 65536;
  static constexpr int64_t kSampleEvery = 4;

  struct Options {
    int ranks = 0;
    int window = kDefaultWindow;  // steps kept per rank
    // A rank is named when its median lateness behind the median rank is over both `min_lateness`
    // and `step_fraction` of the median step time.
    absl::Duration min_lateness = absl::Milliseconds(10);
    double step_fraction = 0.2;
    // No rank is named before this many steps are in the window (the first step, as the ranks
    // start, says little).
    int min_steps = 3;
  };

  struct RankLateness {
    int rank = 0;
    absl::Duration behind_first;   // the median over the window of its lateness per step
    absl::Duration behind_median;  // behind_first less the median rank's (zero when not behind)
    bool flagged = false;          // over the thresholds of Options
  };

  struct Report {
    int steps = 0;                    // steps in the window (0: none ended yet)
    absl::Duration step_time;         // the median step's duration
    std::vector<RankLateness> ranks;  // every rank, by rank; empty while steps == 0
    int straggler = -1;               // the flagged rank furthest behind the median; -1: none
    int64_t last_step = 0;            // the steps ended since the job began
  };

  // A step that ended: the rank that was last to it, and by how much it was behind the first.
  struct StepEnd {
    int64_t step = 0;  // counted from 1
    int last_rank = 0;
    absl::Duration lateness;
    absl::Duration duration;
  };

  explicit StragglerTracker(Options options);

  // Rank `rank` asked for a tensor `lateness` after the first rank did (the negotiator's hot path:
  // every request of every rank; in nanoseconds, inline).
  // REQUIRES: 0 <= rank < ranks.
  void Requested(int rank, int64_t lateness_ns) {
    if (lateness_ns > current_[rank]) current_[rank] = lateness_ns;
  }
  void Requested(int rank, absl::Duration lateness) {
    Requested(rank, absl::ToInt64Nanoseconds(lateness));
  }
  // The first request for tensor `name` came at `now`: the step ends when `name` was already asked
  // for in it, and a new one begins with it. Returns the step that ended, if one did.
  std::optional<StepEnd> TensorStarted(const std::string& name, absl::Time now);

  // Whether the tensor TensorStarted() was last told of is sampled: its requests go to Requested().
  bool Sampled() const { return (step_tensors_ - 1) % kSampleEvery == 0; }

  Report Window() const;
  int64_t steps() const { return steps_; }

 private:
  const Options options_;
  // This step's lateness per rank (nanoseconds), and the last `window` steps' (slot-major).
  std::vector<int64_t> current_;
  std::vector<int64_t> window_;
  std::vector<int64_t> step_ns_;  // each kept step's duration
  int filled_ = 0;                // slots of the window holding a step
  int next_ = 0;                  // the slot the next step goes to
  int64_t steps_ = 0;
  bool started_ = false;  // a tensor was asked for
  // This step's tensors, by the hash of their names (at most kMaxStepTensors).
  absl::flat_hash_set<size_t> step_names_;
  int64_t step_tensors_ = 0;
  absl::Time step_start_;
};

}  // namespace ringmaster
