// Horovod's autotuner, run by the coordinator for one job: scores the negotiation parameters in
// force by the bytes allreduced (and broadcast) per second over a sample of training steps,
// discards the first (warm-up) samples, then moves fusion threshold, cycle time and response cache
// on/off by Bayesian optimisation (bayesian_optimizer.h), and finally settles on the best setting
// found.
//
// The coordinator applies returned parameters between two negotiation cycles, so every rank's
// response list carries the change at the same point. Knobs the user fixed are not tuned.
// Transport-free and clock-free (times are passed in); not thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "coordinator/bayesian_optimizer.h"

namespace ringmaster {

struct AutotuneParameters {
  int64_t fusion_threshold_bytes = int64_t{128} << 20;
  double cycle_time_ms = 1.0;
  bool cache_enabled = true;

  bool operator==(const AutotuneParameters&) const = default;
};

// Search ranges (log scale): fusion threshold 64 KiB .. 256 MiB, cycle time 1 .. 50 ms (Horovod's
// lower bound: below it, ranks send more, smaller request batches and fuse less).
inline constexpr int64_t kAutotuneMinFusionBytes = int64_t{64} << 10;
inline constexpr int64_t kAutotuneMaxFusionBytes = int64_t{256} << 20;
inline constexpr double kAutotuneMinCycleMs = 1.0;
inline constexpr double kAutotuneMaxCycleMs = 50.0;

struct AutotuneOptions {
  int warmup_samples = 3;
  int steps_per_sample = 10;
  int max_samples = 20;
  double noise = 0.8;
  AutotuneParameters start;  // in force when the job starts
  bool tune_fusion_threshold = true;
  bool tune_cycle_time = true;
  bool tune_cache = true;
  // The job's hierarchical knobs, not tuned: the log's first two columns report them.
  bool hierarchical_allreduce = false;
  bool hierarchical_allgather = false;
};

enum class AutotunePhase { kWarmup, kTuning, kDone };

struct AutotuneStatus {
  AutotunePhase phase = AutotunePhase::kWarmup;
  int samples = 0;  // scored (after warm-up)
  int max_samples = 0;
  AutotuneParameters current;
  AutotuneParameters best;
  double best_score = 0;  // bytes per second; 0 before the first scored sample
};

absl::string_view AutotunePhaseName(AutotunePhase phase);

// The autotune log's header: Horovod's columns (the hierarchical ones are the job's, not tuned),
// fusion threshold in MiB, score in bytes per second.
inline constexpr char kAutotuneLogHeader[] =
    "hierarchical_allreduce,hierarchical_allgather,cache_enabled,cycle_time_ms,"
    "tensor_fusion_threshold,score";

class Autotuner {
 public:
  explicit Autotuner(AutotuneOptions options);

  // One negotiation cycle that carried `bytes` of allreduce/broadcast in `tensors` tensors, when
  // the job negotiates `distinct` different tensors (a step is that many tensors). Returns the
  // parameters to apply from the next cycle when they change.
  std::optional<AutotuneParameters> Observe(int64_t bytes, int64_t tensors, int64_t distinct,
                                            absl::Time now);

  AutotuneStatus status() const;

  // Log lines produced since the last call (the header first, then one per scored sample, then the
  // best setting when tuning ends), without newlines.
  std::vector<std::string> TakeLog();

  // The normalised coordinate of a parameter value and back (exposed for tests).
  static double FusionToUnit(int64_t bytes);
  static int64_t UnitToFusion(double x);
  static double CycleToUnit(double ms);
  static double UnitToCycle(double x);

 private:
  Point ToPoint(const AutotuneParameters& p) const;
  AutotuneParameters FromPoint(const Point& x) const;
  void Log(const AutotuneParameters& p, double score);
  // Chooses the parameters of the next sample (or settles when the budget is spent).
  AutotuneParameters Next();

  const AutotuneOptions options_;
  int dimensions_ = 0;
  BayesianOptimizer optimizer_;
  std::vector<AutotuneParameters> sampled_;  // parallel to the optimizer's samples
  AutotunePhase phase_ = AutotunePhase::kWarmup;
  int warmup_left_;
  AutotuneParameters current_;
  AutotuneParameters best_;
  double best_score_ = 0;
  int scored_ = 0;
  // The sample in progress.
  bool started_ = false;
  absl::Time sample_start_;
  int64_t sample_bytes_ = 0;
  int64_t sample_tensors_ = 0;
  std::vector<std::string> log_;
};

}  // namespace ringmaster
