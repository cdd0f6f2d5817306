#include "common/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace ringmaster {
namespace {

void AtomicAdd(std::atomic<double>& target, double by) {
  double current = target.load(std::memory_order_relaxed);
  while (!target.compare_exchange_weak(current, current + by, std::memory_order_relaxed)) {
  }
}

// Prometheus float formatting: integers without a fraction, +Inf/-Inf/NaN spelled its way.
std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buffer[64];
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    std::snprintf(buffer, sizeof(buffer), "%.0f", v);
    return buffer;
  }
  // The shortest text that reads back as the same double.
  for (int precision = 6; precision <= 17; ++precision) {
    std::snprintf(buffer, sizeof(buffer), "%.*g", precision, v);
    if (std::strtod(buffer, nullptr) == v) break;
  }
  return buffer;
}

std::string EscapeLabelValue(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string EscapeHelp(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string LabelText(const Labels& labels,
                      const std::pair<std::string, std::string>* extra = nullptr) {
  if (labels.empty() && extra == nullptr) return "";
  std::string out = "{";
  bool first = true;
  auto add = [&](const std::pair<std::string, std::string>& kv) {
    if (!first) out += ",";
    first = false;
    absl::StrAppend(&out, kv.first, "=\"", EscapeLabelValue(kv.second), "\"");
  };
  for (const auto& kv : labels) add(kv);
  if (extra != nullptr) add(*extra);
  return out + "}";
}

}  // namespace

void Counter::Increment(double by) { AtomicAdd(value_, by); }

void Gauge::Add(double by) { AtomicAdd(value_, by); }

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double v) {
  const size_t bucket =
      std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();  // le semantics
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(sum_, v);
}

std::vector<uint64_t> Histogram::CumulativeCounts() const {
  std::vector<uint64_t> out(bounds_.size() + 1);
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    total += counts_[i].load(std::memory_order_relaxed);
    out[i] = total;
  }
  return out;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> out;
  for (int i = 0; i < count; ++i, start *= factor) out.push_back(start);
  return out;
}

MetricsRegistry::Family& MetricsRegistry::FamilyLocked(const std::string& name,
                                                       const std::string& help, Type type) {
  auto [it, inserted] = families_.try_emplace(name);
  if (inserted) {
    it->second.type = type;
    it->second.help = help;
  }
  return it->second;
}

Counter& MetricsRegistry::GetCounter(const std::string& name, const std::string& help,
                                     const Labels& labels) {
  absl::MutexLock lock(&mu_);
  auto& slot = FamilyLocked(name, help, Type::kCounter).counters[labels];
  if (slot == nullptr) slot = std::make_unique<Counter>();
  return *slot;
}

void MetricsRegistry::RemoveGauge(const std::string& name, const Labels& labels) {
  absl::MutexLock lock(&mu_);
  auto it = families_.find(name);
  if (it != families_.end()) it->second.gauges.erase(labels);
}

Gauge& MetricsRegistry::GetGauge(const std::string& name, const std::string& help,
                                 const Labels& labels) {
  absl::MutexLock lock(&mu_);
  auto& slot = FamilyLocked(name, help, Type::kGauge).gauges[labels];
  if (slot == nullptr) slot = std::make_unique<Gauge>();
  return *slot;
}

Histogram& MetricsRegistry::GetHistogram(const std::string& name, const std::string& help,
                                         const std::vector<double>& bounds, const Labels& labels) {
  absl::MutexLock lock(&mu_);
  auto& slot = FamilyLocked(name, help, Type::kHistogram).histograms[labels];
  if (slot == nullptr) slot = std::make_unique<Histogram>(bounds);
  return *slot;
}

void MetricsRegistry::AddCollector(std::function<void()> collect) {
  absl::MutexLock lock(&mu_);
  collectors_.push_back(std::move(collect));
}

std::string MetricsRegistry::Exposition() const {
  std::vector<std::function<void()>> collectors;
  {
    absl::MutexLock lock(&mu_);
    collectors = collectors_;
  }
  for (auto& collect : collectors) collect();  // they register and set series: lock released
  absl::MutexLock lock(&mu_);
  std::string out;
  for (const auto& [name, family] : families_) {
    const char* type = family.type == Type::kCounter ? "counter"
                       : family.type == Type::kGauge ? "gauge"
                                                     : "histogram";
    absl::StrAppend(&out, "# HELP ", name, " ", EscapeHelp(family.help), "\n# TYPE ", name, " ",
                    type, "\n");
    for (const auto& [labels, c] : family.counters) {
      absl::StrAppend(&out, name, LabelText(labels), " ", FormatValue(c->value()), "\n");
    }
    for (const auto& [labels, g] : family.gauges) {
      absl::StrAppend(&out, name, LabelText(labels), " ", FormatValue(g->value()), "\n");
    }
    for (const auto& [labels, h] : family.histograms) {
      const std::vector<uint64_t> counts = h->CumulativeCounts();
      for (size_t i = 0; i <= h->bounds().size(); ++i) {
        const std::pair<std::string, std::string> le{
            "le", i < h->bounds().size() ? FormatValue(h->bounds()[i]) : "+Inf"};
        absl::StrAppend(&out, name, "_bucket", LabelText(labels, &le), " ", counts[i], "\n");
      }
      absl::StrAppend(&out, name, "_sum", LabelText(labels), " ", FormatValue(h->sum()), "\n");
      absl::StrAppend(&out, name, "_count", LabelText(labels), " ", counts.back(), "\n");
    }
  }
  return out;
}

}  // namespace ringmaster
