// Metrics in the Prometheus data model — counters, gauges and histograms with labels — and their
// text exposition (format 0.0.4). The Prometheus C++ client is not packaged here, so this is the
// small piece Ringmaster needs, checked against the real tools (`promtool check metrics`, a
// Prometheus server) in tests/observability/.
//
// Thread-safe. Registering a series takes the registry's lock; updating one is a relaxed atomic
// operation with no lock, cheap enough for the data path. Callers keep the references the registry
// returns (they live as long as the registry).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ringmaster {

using Labels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void Increment(double by = 1.0);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double by);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Histogram {
 public:
  // `bounds`: the buckets' upper bounds, increasing; +Inf is implicit.
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);

  const std::vector<double>& bounds() const { return bounds_; }
  // Cumulative counts per bound, then the +Inf count; and the sum.
  std::vector<uint64_t> CumulativeCounts() const;
  double sum() const { return sum_.load(std::memory_order_relaxed); }

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // per bucket, not cumulative; last is +Inf
  std::atomic<double> sum_{0};
};

// Bucket bounds: `count` bounds starting at `start`, each `factor` times the previous.
std::vector<double> ExponentialBuckets(double start, double factor, int count);

class MetricsRegistry {
 public:
  // The series of family `name` with `labels`, created on first use. A family's help and type are
  // fixed by its first registration. Names follow Prometheus conventions (`ringmaster_` prefix,
  // base units, `_total` for counters) — callers' responsibility.
  Counter& GetCounter(const std::string& name, const std::string& help, const Labels& labels = {});
  Gauge& GetGauge(const std::string& name, const std::string& help, const Labels& labels = {});
  Histogram& GetHistogram(const std::string& name, const std::string& help,
                          const std::vector<double>& bounds, const Labels& labels = {});

  // Removes a gauge series (a finished job's per-rank series), if it exists.
  // REQUIRES: no reference to it is used afterwards.
  void RemoveGauge(const std::string& name, const Labels& labels);

  // Called at every exposition, before rendering, to refresh gauges computed on demand (e.g. jobs
  // by state). Must not call back into Exposition().
  void AddCollector(std::function<void()> collect);

  // The text exposition format, families and series in a stable order.
  std::string Exposition() const;

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Family {
    Type type;
    std::string help;
    std::map<Labels, std::unique_ptr<Counter>> counters;
    std::map<Labels, std::unique_ptr<Gauge>> gauges;
    std::map<Labels, std::unique_ptr<Histogram>> histograms;
  };

  Family& FamilyLocked(const std::string& name, const std::string& help, Type type)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, Family> families_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> collectors_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ringmaster
