#include "coordinator/straggler_tracker.h"

#include <algorithm>

#include "absl/hash/hash.h"
#include "coordinator/median.h"

namespace ringmaster {

StragglerTracker::StragglerTracker(Options options)
    : options_(options),
      current_(options.ranks, 0),
      window_(static_cast<size_t>(options.window) * options.ranks, 0),
      step_ns_(options.window, 0) {}

std::optional<StragglerTracker::StepEnd> StragglerTracker::TensorStarted(const std::string& name,
                                                                         absl::Time now) {
  const size_t hash = absl::HashOf(name);
  if (!started_) {
    started_ = true;
    step_names_.insert(hash);
    step_start_ = now;
    step_tensors_ = 1;
    return std::nullopt;
  }
  if (step_tensors_ < kMaxStepTensors && step_names_.insert(hash).second) {
    ++step_tensors_;
    return std::nullopt;
  }
  StepEnd end;
  end.step = ++steps_;
  end.duration = now - step_start_;
  const auto last = std::max_element(current_.begin(), current_.end());
  end.last_rank = static_cast<int>(last - current_.begin());
  end.lateness = absl::Nanoseconds(*last);
  std::copy(current_.begin(), current_.end(),
            window_.begin() + static_cast<ptrdiff_t>(next_) * options_.ranks);
  step_ns_[next_] = absl::ToInt64Nanoseconds(end.duration);
  next_ = (next_ + 1) % options_.window;
  filled_ = std::min(filled_ + 1, options_.window);
  std::fill(current_.begin(), current_.end(), 0);
  step_names_.clear();
  step_names_.insert(hash);
  step_start_ = now;
  step_tensors_ = 1;
  return end;
}

StragglerTracker::Report StragglerTracker::Window() const {
  Report report;
  report.steps = filled_;
  report.last_step = steps_;
  if (filled_ == 0) return report;
  std::vector<int64_t> steps(step_ns_.begin(), step_ns_.begin() + filled_);
  report.step_time = absl::Nanoseconds(Median(steps));
  std::vector<int64_t> medians(options_.ranks);
  std::vector<int64_t> values(filled_);
  for (int r = 0; r < options_.ranks; ++r) {
    for (int s = 0; s < filled_; ++s) {
      values[s] = window_[static_cast<size_t>(s) * options_.ranks + r];
    }
    medians[r] = Median(values);
  }
  std::vector<int64_t> sorted = medians;
  const int64_t median_rank = Median(sorted);
  const absl::Duration threshold =
      std::max(options_.min_lateness, report.step_time * options_.step_fraction);
  report.ranks.resize(options_.ranks);
  absl::Duration worst;
  for (int r = 0; r < options_.ranks; ++r) {
    RankLateness& l = report.ranks[r];
    l.rank = r;
    l.behind_first = absl::Nanoseconds(medians[r]);
    l.behind_median = absl::Nanoseconds(std::max<int64_t>(0, medians[r] - median_rank));
    l.flagged = filled_ >= options_.min_steps && l.behind_median > threshold;
    if (l.flagged && l.behind_median > worst) {
      worst = l.behind_median;
      report.straggler = r;
    }
  }
  return report;
}

}  // namespace ringmaster
