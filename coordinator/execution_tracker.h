// Who is slow, from the workers' side: each rank's execution totals (RankExecution, about once a
// second) over the last `window` reports, and over them the share of the wall time its collectives
// took, the share inside network communicators, and the rate its host's data-plane connections send
// at while they have data in flight (bytes acknowledged / busy time, the kernel's TCP_INFO).
//
// A rank late to submit makes every other rank wait before a collective starts, which the
// negotiation's lateness shows (StragglerTracker). A slow link does not: every rank submits on
// time and every collective is slow. It shows here: the ranks on that host send at a fraction of
// the others' rate. A rank is named "slow link" when its rate is under `link_fraction` of the
// median rank's while its own collectives spend `min_network_share` or more of the wall time in
// network communicators (a slow link that costs the job nothing is not named).
//
// Memory is bounded: window + 1 reports per rank. Not thread-safe: its owner serialises calls.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace ringmaster {

class ExecutionTracker {
 public:
  static constexpr int kDefaultWindow = 5;

  struct Options {
    int ranks = 0;
    int window = kDefaultWindow;  // reports kept per rank, beyond the one the window starts at
    double link_fraction = 0.5;
    double min_network_share = 0.1;
    // A rank's rate is known once its connections sent this many bytes over the window.
    int64_t min_link_bytes = int64_t{1} << 20;
  };

  // One report's totals (RankExecution).
  struct Sample {
    int64_t elapsed_ns = 0;
    int64_t collectives = 0;
    int64_t collective_ns = 0;
    int64_t network_ns = 0;
    int64_t link_bytes_sent = 0;
    int64_t link_busy_ns = 0;
  };

  struct RankFigures {
    bool measured = false;  // two reports of it, some time apart, are in the window
    double collective_share = 0;
    double network_share = 0;
    double link_bytes_per_second = 0;  // 0: too few bytes sent to say
    bool slow_link = false;
  };

  struct Report {
    std::vector<RankFigures> ranks;           // by rank
    double median_link_bytes_per_second = 0;  // over the ranks whose rate is known (0: none)
    int slowest_link = -1;                    // the rank named "slow link" with the lowest rate
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
