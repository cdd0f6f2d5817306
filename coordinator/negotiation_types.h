// Plain data exchanged with the Negotiator: what one rank alone is told, what a cycle produces and
// what the timeline records of negotiation. The requests and responses themselves are shared with
// the workers (common/negotiation_types.h). The service layer converts these to and from
// ringmaster.v1 messages.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/negotiation_types.h"
#include "common/tensor.h"

namespace ringmaster {

// What one rank alone is told.
struct RankNotice {
  std::vector<uint32_t> resend_ids;
  // Requests rejected for this rank alone (invalid, or a name already in flight): kError responses.
  std::vector<Response> errors;

  bool empty() const { return resend_ids.empty() && errors.empty(); }
};

// The outcome of one negotiation cycle of a job.
struct CycleOutput {
  std::vector<CacheAssignment> cache_assignments;
  std::vector<uint32_t> evicted_ids;
  std::vector<Response> responses;  // the same for every rank
  std::vector<RankNotice> notices;  // indexed by rank
  // When the oldest tensor in `responses` was first submitted (negotiation latency: first request
  // to response); InfiniteFuture when the cycle carries notices only.
  absl::Time oldest_submit = absl::InfiniteFuture();
};

// A step of a tensor's negotiation, recorded for the timeline when a job has one.
// The timeline's row of step ends (NegotiationEvent::Kind::kStepEnd).
inline constexpr char kStepsTimelineRow[] = "steps: the last rank";
// The timeline's row of who is slow (NegotiationEvent::Kind::kNamed).
inline constexpr char kWhoIsSlowTimelineRow[] = "who is slow";

struct NegotiationEvent {
  enum class Kind {
    kStart,      // the first rank submitted the tensor
    kRankReady,  // `rank` submitted it (the first rank too)
    kEnd,        // every rank submitted it: ready to leave in a response
    kStepEnd,    // a step ended (StragglerTracker): `rank` was last to it, `lateness` behind
    kNamed,      // `rank` is named as holding the job back (-1: none is any more), for `verdict`
  };
  Kind kind = Kind::kStart;
  std::string name;
  RequestType type = RequestType::kUnspecified;
  int32_t rank = -1;
  absl::Time time;
  int64_t step = 0;  // kStepEnd: the step, from 1
  absl::Duration lateness;
  std::string verdict;  // kNamed: "late to submit" or "slow link"
  std::string detail;   // kNamed: the figures that named it
};

}  // namespace ringmaster
