#include "coordinator/autotuner.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ringmaster {
namespace {

// The radical-inverse (Halton) sequence: well-spread first points for the initial design.
double Halton(int index, int base) {
  double f = 1, r = 0;
  for (int i = index; i > 0; i /= base) {
    f /= base;
    r += f * (i % base);
  }
  return r;
}

}  // namespace

absl::string_view AutotunePhaseName(AutotunePhase phase) {
  switch (phase) {
    case AutotunePhase::kWarmup:
      return "warmup";
    case AutotunePhase::kTuning:
      return "tuning";
    case AutotunePhase::kDone:
      return "done";
  }
  return "?";
}

double Autotuner::FusionToUnit(int64_t bytes) {
  const double lo = std::log2(static_cast<double>(kAutotuneMinFusionBytes));
  const double hi = std::log2(static_cast<double>(kAutotuneMaxFusionBytes));
  const double b = std::log2(static_cast<double>(std::max<int64_t>(bytes, 1)));
  return std::clamp((b - lo) / (hi - lo), 0.0, 1.0);
}

int64_t Autotuner::UnitToFusion(double x) {
  const double lo = std::log2(static_cast<double>(kAutotuneMinFusionBytes));
  const double hi = std::log2(static_cast<double>(kAutotuneMaxFusionBytes));
  // Whole KiB: the log reads better and nothing finer matters.
  const double bytes = std::exp2(lo + std::clamp(x, 0.0, 1.0) * (hi - lo));
  return static_cast<int64_t>(std::llround(bytes / 1024)) * 1024;
}

double Autotuner::CycleToUnit(double ms) {
  const double lo = std::log(kAutotuneMinCycleMs), hi = std::log(kAutotuneMaxCycleMs);
  return std::clamp((std::log(std::max(ms, 1e-6)) - lo) / (hi - lo), 0.0, 1.0);
}

double Autotuner::UnitToCycle(double x) {
  const double lo = std::log(kAutotuneMinCycleMs), hi = std::log(kAutotuneMaxCycleMs);
  const double ms = std::exp(lo + std::clamp(x, 0.0, 1.0) * (hi - lo));
  return std::round(ms * 100) / 100;  // 10 us steps
}

Autotuner::Autotuner(AutotuneOptions options)
    : options_(options),
      dimensions_(int{options.tune_fusion_threshold} + int{options.tune_cycle_time} +
                  int{options.tune_cache}),
      optimizer_(dimensions_, options.noise,
                 options.tune_cache ? std::vector<int>{dimensions_ - 1} : std::vector<int>{}),
      warmup_left_(options.warmup_samples),
      current_(options.start),
      best_(options.start) {
  log_.push_back(kAutotuneLogHeader);
  if (warmup_left_ <= 0) phase_ = AutotunePhase::kTuning;
  if (dimensions_ == 0) phase_ = AutotunePhase::kDone;  // everything fixed: nothing to tune
}

Point Autotuner::ToPoint(const AutotuneParameters& p) const {
  Point x;
  if (options_.tune_fusion_threshold) x.push_back(FusionToUnit(p.fusion_threshold_bytes));
  if (options_.tune_cycle_time) x.push_back(CycleToUnit(p.cycle_time_ms));
  if (options_.tune_cache) x.push_back(p.cache_enabled ? 1.0 : 0.0);
  return x;
}

AutotuneParameters Autotuner::FromPoint(const Point& x) const {
  AutotuneParameters p = options_.start;
  size_t i = 0;
  if (options_.tune_fusion_threshold) p.fusion_threshold_bytes = UnitToFusion(x[i++]);
  if (options_.tune_cycle_time) p.cycle_time_ms = UnitToCycle(x[i++]);
  if (options_.tune_cache) p.cache_enabled = x[i++] >= 0.5;
  return p;
}

void Autotuner::Log(const AutotuneParameters& p, double score) {
  log_.push_back(absl::StrFormat("%d,%d,%d,%g,%g,%.0f", options_.hierarchical_allreduce ? 1 : 0,
                                 options_.hierarchical_allgather ? 1 : 0, p.cache_enabled ? 1 : 0,
                                 p.cycle_time_ms,
                                 static_cast<double>(p.fusion_threshold_bytes) / (1 << 20), score));
}

AutotuneParameters Autotuner::Next() {
  if (scored_ >= options_.max_samples) {
    phase_ = AutotunePhase::kDone;
    // The setting actually measured (the start may lie outside the search range, where its point
    // was clamped).
    double mean;
    best_ = sampled_[optimizer_.BestIndex(&mean)];
    best_score_ = mean;
    Log(best_, best_score_);
    return best_;
  }
  // Initial design: the starting setting (sample 0), then one well-spread point per dimension.
  if (scored_ <= dimensions_) {
    const int bases[] = {2, 3, 5};
    Point x(dimensions_);
    for (int d = 0; d < dimensions_; ++d) x[d] = Halton(scored_, bases[d]);
    return FromPoint(x);
  }
  return FromPoint(optimizer_.Suggest());
}

std::optional<AutotuneParameters> Autotuner::Observe(int64_t bytes, int64_t tensors,
                                                     int64_t distinct, absl::Time now) {
  if (phase_ == AutotunePhase::kDone) return std::nullopt;
  if (!started_) {  // the job's first cycle: the first sample starts here
    started_ = true;
    sample_start_ = now;
    return std::nullopt;
  }
  sample_bytes_ += bytes;
  sample_tensors_ += tensors;
  if (distinct <= 0 || sample_tensors_ < options_.steps_per_sample * distinct) return std::nullopt;
  const double seconds = absl::ToDoubleSeconds(now - sample_start_);
  const double score = seconds > 0 ? static_cast<double>(sample_bytes_) / seconds : 0.0;
  // The next sample starts now, under the parameters chosen below. (The first cycles after a
  // change carry tensors negotiated partly under the previous ones; over a sample of several steps
  // that is noise, and counting from the change keeps cycles without tensors, such as the one that
  // tells ranks about cache evictions, from shifting the window.)
  sample_start_ = now;
  sample_bytes_ = sample_tensors_ = 0;
  if (phase_ == AutotunePhase::kWarmup) {
    if (--warmup_left_ == 0) phase_ = AutotunePhase::kTuning;
    return std::nullopt;
  }
  Log(current_, score);
  optimizer_.AddSample(ToPoint(current_), score);
  sampled_.push_back(current_);
  ++scored_;
  if (score > best_score_) {
    best_score_ = score;
    best_ = current_;
  }
  const AutotuneParameters next = Next();
  if (next == current_) return std::nullopt;
  current_ = next;
  return current_;
}

AutotuneStatus Autotuner::status() const {
  AutotuneStatus s;
  s.phase = phase_;
  s.samples = scored_;
  s.max_samples = options_.max_samples;
  s.current = current_;
  s.best = best_;
  s.best_score = best_score_;
  return s;
}

std::vector<std::string> Autotuner::TakeLog() {
  std::vector<std::string> out;
  out.swap(log_);
  return out;
}

}  // namespace ringmaster
