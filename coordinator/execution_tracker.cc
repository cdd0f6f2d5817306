#include "coordinator/execution_tracker.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "coordinator/median.h"

namespace ringmaster {

ExecutionTracker::ExecutionTracker(Options options) : options_(options), samples_(options.ranks) {}

absl::Status ExecutionTracker::Reported(int rank, const Sample& sample) {
  if (rank < 0 || rank >= options_.ranks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "execution.rank ", rank, " is not a rank of the job (0..", options_.ranks - 1, ")"));
  }
  if (sample.elapsed_ns < 0 || sample.collectives < 0 || sample.collective_ns < 0 ||
      sample.network_ns < 0 || sample.link_bytes_sent < 0 || sample.link_busy_ns < 0 ||
      sample.link_delivery_rate < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("execution of rank ", rank, " has a negative total"));
  }
  std::vector<Sample>& kept = samples_[rank];
  if (!kept.empty()) {
    const Sample& last = kept.back();
    if (sample.elapsed_ns <= last.elapsed_ns || sample.collectives < last.collectives ||
        sample.collective_ns < last.collective_ns || sample.network_ns < last.network_ns ||
        sample.link_bytes_sent < last.link_bytes_sent || sample.link_busy_ns < last.link_busy_ns) {
      kept.clear();  // a new set of totals
    }
  }
  if (kept.size() > static_cast<size_t>(options_.window)) kept.erase(kept.begin());
  kept.push_back(sample);
  return absl::OkStatus();
}

ExecutionTracker::Report ExecutionTracker::Window() const {
  Report report;
  report.ranks.resize(options_.ranks);
  // Per host: its ranks' rates (its rate is their median), and the lowest network share of its
  // ranks with a rate.
  struct Host {
    std::vector<double> rates;
    double rate = 0;
    double network_share = 1;
  };
  std::vector<Host> hosts;
  auto host_of = [&](int rank) {
    return static_cast<size_t>(options_.hosts.empty() ? rank : options_.hosts[rank]);
  };
  for (int r = 0; r < options_.ranks; ++r) {
    const std::vector<Sample>& kept = samples_[r];
    if (kept.size() < 2) continue;
    const Sample& first = kept.front();
    const Sample& last = kept.back();
    const double seconds = static_cast<double>(last.elapsed_ns - first.elapsed_ns) * 1e-9;
    RankFigures& f = report.ranks[r];
    f.measured = true;
    f.collective_share =
        static_cast<double>(last.collective_ns - first.collective_ns) * 1e-9 / seconds;
    f.network_share = static_cast<double>(last.network_ns - first.network_ns) * 1e-9 / seconds;
    for (size_t i = 1; i < kept.size(); ++i) {
      if (kept[i].link_bytes_sent - kept[i - 1].link_bytes_sent >= options_.min_link_bytes) {
        f.link_bytes_per_second =
            std::max(f.link_bytes_per_second, static_cast<double>(kept[i].link_delivery_rate));
      }
    }
    if (f.link_bytes_per_second > 0) {
      const size_t h = host_of(r);
      if (h >= hosts.size()) hosts.resize(h + 1);
      hosts[h].rates.push_back(f.link_bytes_per_second);
      hosts[h].network_share = std::min(hosts[h].network_share, f.network_share);
    }
  }
  for (Host& h : hosts) {
    if (!h.rates.empty()) h.rate = Median(h.rates);
  }
  for (int r = 0; r < options_.ranks; ++r) {
    RankFigures& f = report.ranks[r];
    const size_t h = host_of(r);
    if (f.link_bytes_per_second == 0 || h >= hosts.size()) continue;
    std::vector<double> others;
    for (size_t o = 0; o < hosts.size(); ++o) {
      if (o != h && hosts[o].rate > 0) others.push_back(hosts[o].rate);
    }
    f.host_link_bytes_per_second = hosts[h].rate;
    if (others.empty()) continue;  // one host: nothing to compare with
    f.others_link_bytes_per_second = Median(others);
    f.slow_link = hosts[h].rate < f.others_link_bytes_per_second * options_.link_fraction &&
                  hosts[h].network_share >= options_.min_network_share;
    if (f.slow_link &&
        (report.slowest_link < 0 ||
         f.link_bytes_per_second < report.ranks[report.slowest_link].link_bytes_per_second)) {
      report.slowest_link = r;
    }
  }
  return report;
}

}  // namespace ringmaster
