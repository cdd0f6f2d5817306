// Who is slow, from the workers' side: each rank's execution totals (RankExecution, twice a
// second) over the last `window` reports, and over them the share of the wall time its collectives
// took, the share inside network communicators, and the rate its host's data-plane connections
// carry.
//
// A rank late to submit makes every other rank wait before a collective starts, which the
// negotiation's lateness shows (StragglerTracker). A slow link does not: every rank submits on
// time and every collective is slow. It shows here. A rank's link rate is the highest of the
// kernel's delivery-rate samples (TCP_INFO) its reports carry over the window, from intervals in
// which it sent `min_link_bytes` or more: as BBR estimates a path's bandwidth, a max filter, since
// queueing and delayed acknowledgements only ever lower a sample. A host's rate is the median of
// its ranks'. A host is named "slow link" (each of its ranks) when its rate is under
// `link_fraction` of the median of the other hosts' rates while its ranks' collectives spend
// `min_network_share` or more of the wall time in network communicators (a slow link that costs the
// job nothing is not named).
//
// Memory is bounded: window + 1 reports per rank. Not thread-safe: its owner serialises calls.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace ringmaster {

class ExecutionTracker {
 public:
  static constexpr int kDefaultWindow = 3;

  struct Options {
    int ranks = 0;
    // Each rank's host (an index, the same for ranks on one host); empty: each rank its own.
    std::vector<int> hosts;
    int window = kDefaultWindow;  // reports kept per rank, beyond the one the window starts at
    double link_fraction = 1.0 / 3;
    double min_network_share = 0.1;
    // A report's delivery rate counts when its connections sent this many bytes since the last.
    int64_t min_link_bytes = int64_t{256} << 10;
  };

  // One report's totals (RankExecution).
  struct Sample {
    int64_t elapsed_ns = 0;
    int64_t collectives = 0;
    int64_t collective_ns = 0;
    int64_t network_ns = 0;
    int64_t link_bytes_sent = 0;
    int64_t link_busy_ns = 0;
    int64_t link_delivery_rate = 0;  // bytes per second; 0: no sample
  };

  struct RankFigures {
    bool measured = false;  // two reports of it, some time apart, are in the window
    double collective_share = 0;
    double network_share = 0;
    double link_bytes_per_second = 0;  // its link rate (0: too few bytes sent to say)
    // Its host's rate, and the median of the other hosts' (0: unknown).
    double host_link_bytes_per_second = 0;
    double others_link_bytes_per_second = 0;
    bool slow_link = false;  // its host is named
  };

  struct Report {
    std::vector<RankFigures> ranks;  // by rank
    int slowest_link = -1;           // a rank of the named host with the lowest rate (-1: none)
  };

  explicit ExecutionTracker(Options options);

  // INVALID_ARGUMENT for a rank out of range or a negative total. Totals that went back (the
  // worker's epoch began again) start the rank's window afresh.
  absl::Status Reported(int rank, const Sample& sample);

  Report Window() const;

 private:
  const Options options_;
  // Per rank, its last window + 1 reports, oldest first.
  std::vector<std::vector<Sample>> samples_;
};

}  // namespace ringmaster
