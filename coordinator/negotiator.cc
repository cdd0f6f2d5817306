#include "coordinator/negotiator.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ringmaster {
namespace {

constexpr size_t kMaxNameBytes = 1024;
// Names of the client library's own collectives that no rank waits for unless it asks.
constexpr char kBackgroundPrefix[] = "ringmaster.init.";
constexpr int kMaxDims = 16;
constexpr int64_t kMaxElements = int64_t{1} << 40;
constexpr int kMaxStallNamesPerRank = 10;

bool Fusable(RequestType t) { return t == RequestType::kAllreduce || t == RequestType::kAllgather; }

Response::Type ResponseTypeOf(RequestType t) {
  switch (t) {
    case RequestType::kAllreduce:
      return Response::Type::kAllreduce;
    case RequestType::kAllgather:
      return Response::Type::kAllgather;
    case RequestType::kBroadcast:
      return Response::Type::kBroadcast;
    case RequestType::kJoin:
      return Response::Type::kJoin;
    case RequestType::kBarrier:
      return Response::Type::kBarrier;
    case RequestType::kUnspecified:
      break;
  }
  return Response::Type::kError;
}

// Whether `rank` takes part in the request's collective (every rank for the global set).
bool InSet(const TensorRequest& r, int rank) {
  return r.process_set_ranks.empty() ||
         std::binary_search(r.process_set_ranks.begin(), r.process_set_ranks.end(), rank);
}

// A tensor in negotiation: its name, within its process set (each set names its own tensors, as
// in Horovod, so two sets may negotiate the same name at once).
// The name itself for the global set (no copy on the hot path); `storage` holds a set's key.
const std::string& PendingKey(const TensorRequest& r, std::string& storage) {
  if (r.process_set_id == 0) return r.name;
  storage = absl::StrCat(r.name, "\x1f", r.process_set_id);
  return storage;
}

}  // namespace

Negotiator::Negotiator(NegotiatorOptions options)
    : job_id_(std::move(options.job_id)),
      rank_hosts_(std::move(options.rank_hosts)),
      size_(static_cast<int>(rank_hosts_.size())),
      fusion_threshold_bytes_(options.fusion_threshold_bytes),
      cycle_time_(options.cycle_time),
      stall_check_(options.stall_check),
      stall_shutdown_(options.stall_shutdown),
      cache_(options.cache_capacity),
      record_timeline_(options.record_timeline),
      joined_(size_, 0),
      join_names_(size_),
      ended_(size_),
      notices_(size_),
      stragglers_({.ranks = size_}) {}

std::string Negotiator::RankName(int rank) const {
  return absl::StrCat("rank ", rank, " (", rank_hosts_[rank], ")");
}

std::string Negotiator::Validate(const TensorRequest& r, int size) {
  if (r.name.empty()) return "name is empty";
  if (r.name.size() > kMaxNameBytes) {
    return absl::StrCat("name is ", r.name.size(), " bytes long; at most 1024 are allowed");
  }
  const auto type = static_cast<int32_t>(r.type);
  if (type <= 0 || type > kMaxRequestType)
    return absl::StrCat("type ", type, " is not a collective");
  const bool has_data = r.type == RequestType::kAllreduce || r.type == RequestType::kAllgather ||
                        r.type == RequestType::kBroadcast;
  if (has_data) {
    const auto dtype = static_cast<int32_t>(r.dtype);
    if (dtype <= 0 || dtype > kMaxDataType)
      return absl::StrCat("dtype ", dtype, " is not a data type");
    if (r.shape.size() > kMaxDims) {
      return absl::StrCat("shape has ", r.shape.size(), " dimensions; at most 16 are allowed");
    }
    int64_t elements = 1;
    for (size_t i = 0; i < r.shape.size(); ++i) {
      if (r.shape[i] < 0 || r.shape[i] > kMaxElements) {
        return absl::StrCat("shape[", i, "] = ", r.shape[i], " is out of bounds [0, 2^40]");
      }
      elements = r.shape[i] == 0 ? 0
                                 : (elements > kMaxElements / r.shape[i] ? kMaxElements + 1
                                                                         : elements * r.shape[i]);
    }
    if (elements > kMaxElements) return "shape has more than 2^40 elements";
  }
  if (r.type == RequestType::kAllgather && r.shape.empty()) {
    return "allgather needs a tensor of at least one dimension";
  }
  if (r.type == RequestType::kBroadcast && (r.root_rank < 0 || r.root_rank >= size)) {
    return absl::StrCat("root_rank ", r.root_rank, " is out of bounds [0, ", size - 1, "]");
  }
  const auto op = static_cast<int32_t>(r.reduce_op);
  if (op < 0 || op > kMaxReduceOp) return absl::StrCat("reduce_op ", op, " is not a reduction");
  if (!std::isfinite(r.prescale_factor)) return "prescale_factor is not finite";
  if (!std::isfinite(r.postscale_factor)) return "postscale_factor is not finite";
  if (r.device < -1 || r.device >= 1024) {
    return absl::StrCat("device ", r.device, " is out of bounds [-1, 1023]");
  }
  if (r.process_set_id < 0) {
    return absl::StrCat("process_set_id ", r.process_set_id, " is negative");
  }
  if ((r.process_set_id == 0) != r.process_set_ranks.empty()) {
    return r.process_set_id == 0 ? "process_set_ranks are given for the global process set (0)"
                                 : absl::StrCat("process set ", r.process_set_id, " has no ranks");
  }
  for (size_t i = 0; i < r.process_set_ranks.size(); ++i) {
    const int32_t member = r.process_set_ranks[i];
    if (member < 0 || member >= size || (i > 0 && member <= r.process_set_ranks[i - 1])) {
      return absl::StrCat("process set ", r.process_set_id, " ranks ",
                          absl::StrJoin(r.process_set_ranks, ", "),
                          " are not distinct increasing ranks in [0, ", size - 1, "]");
    }
  }
  if (r.type == RequestType::kBroadcast && r.process_set_id > 0 &&
      !std::binary_search(r.process_set_ranks.begin(), r.process_set_ranks.end(), r.root_rank)) {
    return absl::StrCat("root_rank ", r.root_rank, " is not in process set ", r.process_set_id,
                        " (ranks ", absl::StrJoin(r.process_set_ranks, ", "), ")");
  }
  if (r.group_id < 0) return absl::StrCat("group_id ", r.group_id, " is negative");
  if (r.group_id > 0 && (r.group_size < 1 || r.group_size > 65536)) {
    return absl::StrCat("group_size ", r.group_size, " is out of bounds [1, 65536]");
  }
  return "";
}

std::string Negotiator::Mismatch(const Pending& p, const TensorRequest& r, int rank) const {
  const TensorRequest& f = p.request;
  const std::string who = absl::StrCat(RankName(p.first_rank), " and ", RankName(rank));
  auto differ = [&](absl::string_view what, const std::string& a, const std::string& b) {
    return absl::StrCat("Mismatched ", what, " for tensor '", QuotedName(f.name),
                        "': ", RankName(p.first_rank), " sent ", a, " but ", RankName(rank),
                        " sent ", b, ".");
  };
  if (f.type != r.type) {
    return differ("collective operations", std::string(RequestTypeName(f.type)),
                  std::string(RequestTypeName(r.type)));
  }
  const std::string op(RequestTypeName(f.type));
  if (f.dtype != r.dtype) {
    return differ(absl::StrCat(op, " data types"), std::string(DataTypeName(f.dtype)),
                  std::string(DataTypeName(r.dtype)));
  }
  if (f.type == RequestType::kAllgather) {
    bool same = f.shape.size() == r.shape.size() &&
                std::equal(f.shape.begin() + 1, f.shape.end(), r.shape.begin() + 1);
    if (!same) {
      return differ("allgather tensor shapes (all dimensions but the first must match)",
                    ShapeString(f.shape), ShapeString(r.shape));
    }
  } else if (f.shape != r.shape) {
    return differ(absl::StrCat(op, " tensor shapes"), ShapeString(f.shape), ShapeString(r.shape));
  }
  if (f.type == RequestType::kBroadcast && f.root_rank != r.root_rank) {
    return differ("broadcast root ranks", absl::StrCat("root ", f.root_rank),
                  absl::StrCat("root ", r.root_rank));
  }
  if (f.type == RequestType::kAllreduce) {
    ReduceOp a = f.reduce_op == ReduceOp::kUnspecified ? ReduceOp::kAverage : f.reduce_op;
    ReduceOp b = r.reduce_op == ReduceOp::kUnspecified ? ReduceOp::kAverage : r.reduce_op;
    if (a != b) {
      return differ("allreduce reduction ops", std::string(ReduceOpName(a)),
                    std::string(ReduceOpName(b)));
    }
  }
  if (f.prescale_factor != r.prescale_factor) {
    return differ(absl::StrCat(op, " prescale factors"), absl::StrCat(f.prescale_factor),
                  absl::StrCat(r.prescale_factor));
  }
  if (f.postscale_factor != r.postscale_factor) {
    return differ(absl::StrCat(op, " postscale factors"), absl::StrCat(f.postscale_factor),
                  absl::StrCat(r.postscale_factor));
  }
  if ((f.device < 0) != (r.device < 0)) {
    return differ(absl::StrCat(op, " devices"), DeviceName(f.device), DeviceName(r.device));
  }
  if (f.process_set_id != r.process_set_id || f.process_set_ranks != r.process_set_ranks) {
    return differ(absl::StrCat(op, " process sets"),
                  absl::StrCat("process set ", f.process_set_id, " [",
                               absl::StrJoin(f.process_set_ranks, ", "), "]"),
                  absl::StrCat("process set ", r.process_set_id, " [",
                               absl::StrJoin(r.process_set_ranks, ", "), "]"));
  }
  if (f.group_id != r.group_id || f.group_size != r.group_size) {
    return differ(absl::StrCat(op, " groups"),
                  absl::StrCat("group ", f.group_id, " of ", f.group_size),
                  absl::StrCat("group ", r.group_id, " of ", r.group_size));
  }
  return "";
}

int64_t Negotiator::ByteSize(const Pending& p) const {
  const TensorRequest& r = p.request;
  const int64_t elem = DataTypeSize(r.dtype);
  if (r.type == RequestType::kAllgather) {
    int64_t row = NumElements(absl::MakeConstSpan(r.shape).subspan(1)) * elem;
    int64_t rows = 0;
    for (int64_t d : p.first_dims) rows += d;
    return rows * row;
  }
  return NumElements(r.shape) * elem;
}

bool Negotiator::Compatible(const Pending& a, const Pending& b) const {
  const TensorRequest& x = a.request;
  const TensorRequest& y = b.request;
  return a.error.empty() && b.error.empty() && x.type == y.type && x.dtype == y.dtype &&
         x.device == y.device && x.reduce_op == y.reduce_op &&
         x.process_set_id == y.process_set_id && x.process_set_ranks == y.process_set_ranks &&
         x.prescale_factor == y.prescale_factor && x.postscale_factor == y.postscale_factor;
}

void Negotiator::Submit(int rank, std::vector<TensorRequest> requests,
                        absl::Span<const uint32_t> cached_ids, absl::Time now) {
  absl::MutexLock lock(&mu_);
  now_ns_ = absl::ToUnixNanos(now);
  stats_.requests += static_cast<int64_t>(requests.size() + cached_ids.size());
  for (uint32_t id : cached_ids) {
    if (auto it = pending_by_id_.find(id); it != pending_by_id_.end()) {
      SubmitCached(rank, *it->second, now);
      continue;
    }
    SubmitUnindexed(rank, id, now);
  }
  for (TensorRequest& request : requests) {
    if (request.reduce_op == ReduceOp::kUnspecified) request.reduce_op = ReduceOp::kAverage;
    if (request.prescale_factor == 0) request.prescale_factor = 1.0;
    if (request.postscale_factor == 0) request.postscale_factor = 1.0;
    std::string problem = Validate(request, size_);
    if (problem.empty() && request.process_set_id > 0 &&
        !std::binary_search(request.process_set_ranks.begin(), request.process_set_ranks.end(),
                            rank)) {
      problem = absl::StrCat("the rank is not in process set ", request.process_set_id, " (ranks ",
                             absl::StrJoin(request.process_set_ranks, ", "), ")");
    }
    if (!problem.empty()) {
      RankError(
          rank, request.name,
          absl::StrCat("Invalid ", RequestTypeName(request.type), " request for tensor '",
                       QuotedName(request.name), "' from ", RankName(rank), ": ", problem, "."));
      continue;
    }
    if (request.type == RequestType::kJoin) {
      Join(rank, request.name, now);
      continue;
    }
    // A full request whose metadata differ from the cached entry invalidates it; ranks that still
    // send the old id then meet a mismatch (or, once evicted, a resend).
    SubmitOne(rank, request, 0, now);
  }
}

void Negotiator::Touch(absl::Span<const uint32_t> ids) {
  absl::MutexLock lock(&mu_);
  for (uint32_t id : ids) cache_.Touch(id);
}

void Negotiator::SubmitShared(absl::Span<const int32_t> ranks,
                              absl::Span<const uint32_t> cached_ids, absl::Time now) {
  absl::MutexLock lock(&mu_);
  now_ns_ = absl::ToUnixNanos(now);
  stats_.requests += static_cast<int64_t>(ranks.size() * cached_ids.size());
  for (uint32_t id : cached_ids) {
    Pending* p = nullptr;
    if (auto it = pending_by_id_.find(id); it != pending_by_id_.end()) p = it->second;
    for (int32_t rank : ranks) {
      if (p != nullptr) {
        SubmitCached(rank, *p, now);
        continue;
      }
      // The first rank's request makes the tensor pending (and indexed by the id, when the cache
      // still has it): the others' go straight to it.
      SubmitUnindexed(rank, id, now);
      if (auto it = pending_by_id_.find(id); it != pending_by_id_.end()) p = it->second;
    }
  }
}

void Negotiator::SubmitUnindexed(int rank, uint32_t id, absl::Time now) {
  const TensorRequest* cached = cache_.Lookup(id);
  if (cached == nullptr) {
    notices_[rank].resend_ids.push_back(id);
    has_notices_ = true;
    return;
  }
  SubmitOne(rank, *cached, id, now);
}

void Negotiator::RankError(int rank, const std::string& name, std::string message) {
  Response error;
  error.type = Response::Type::kError;
  error.names.push_back(name);
  error.cache_ids.push_back(0);
  error.error_message = std::move(message);
  notices_[rank].errors.push_back(std::move(error));
  has_notices_ = true;
}

void Negotiator::SubmitCached(int rank, Pending& p, absl::Time now) {
  if (joined_[rank] || p.submitted[rank] || p.ready) {  // errors: as SubmitOne words them
    SubmitOne(rank, p.request, p.cache_id, now);
    return;
  }
  // Cached requests are never allgathers (no first dimensions) nor a process set's.
  p.submitted.Set(rank);
  ++p.count;
  if (p.timed) stragglers_.Requested(rank, now_ns_ - p.first_submit_ns);
  RecordTimeline(NegotiationEvent::Kind::kRankReady, p.request, rank, now);
  // Every rank has submitted or joined only once the two add up to the job's size (the hot path:
  // at 1024 ranks this runs for each rank and tensor).
  if (p.count + joined_count_ >= size_ && AllSubmitted(p)) MarkReady(&p, now);
}

void Negotiator::ForgetIds(absl::Span<const uint32_t> ids) {
  for (uint32_t id : ids) {
    auto it = pending_by_id_.find(id);
    if (it == pending_by_id_.end()) continue;
    it->second->indexed_id = 0;
    pending_by_id_.erase(it);
  }
}

void Negotiator::SubmitOne(int rank, const TensorRequest& request, uint32_t cache_id,
                           absl::Time now) {
  std::string key_storage;
  if (joined_[rank]) {
    RankError(
        rank, request.name,
        absl::StrCat("Tensor '", QuotedName(request.name), "' was submitted by ", RankName(rank),
                     " after it joined; a joined rank submits no collectives."));
    return;
  }
  if (ended_count_ > 0 && !pending_.contains(PendingKey(request, key_storage))) {
    // A new collective that needs a rank that has ended.
    if (const int ended = EndedRankOf(request); ended >= 0) {
      std::string error = NeverCompletes(request, ended, false);
      if (ended_failure_.empty()) ended_failure_ = error;
      RankError(rank, request.name, std::move(error));
      return;
    }
  }
  const std::string& key = PendingKey(request, key_storage);
  if (pending_.size() >= kMaxPending && !pending_.contains(key)) {
    RankError(
        rank, request.name,
        absl::StrCat("Tensor '", QuotedName(request.name), "' was not accepted: ", pending_.size(),
                     " tensors are in negotiation in this job, the most one "
                     "job may (did the other ranks submit the tensors ",
                     RankName(rank), " submitted?)"));
    return;
  }
  auto [it, inserted] = pending_.try_emplace(key);
  Pending& p = it->second;
  if (inserted) {
    p.request = request;
    p.first_rank = rank;
    p.cache_id = cache_id;
    if (cache_id != 0) {
      p.indexed_id = cache_id;
      pending_by_id_[cache_id] = &p;
    }
    p.submitted.Reset(size_);
    p.first_submit = now;
    p.first_submit_ns = now_ns_;
    if (std::optional<StragglerTracker::StepEnd> end =
            stragglers_.TensorStarted(request.name, now)) {
      RecordStep(*end, now);
    }
    p.timed = stragglers_.Sampled();
    if (request.type == RequestType::kAllgather) p.first_dims.assign(size_, 0);
    ++waiting_;
    RecordTimeline(NegotiationEvent::Kind::kStart, request, rank, now);
  } else if (p.ready && !p.submitted[rank] && !p.error.empty()) {
    // Failed before this rank submitted it (a rank it needs ended): it leaves with its error in
    // the next cycle's responses, which this rank executes too.
    p.submitted.Set(rank);
    ++p.count;
    return;
  } else if (p.submitted[rank] || p.ready) {
    RankError(rank, request.name,
              absl::StrCat("Tensor '", QuotedName(request.name), "' is already in flight on ",
                           RankName(rank),
                           ": wait for it to complete before submitting it again, or use a "
                           "different name."));
    return;
  } else if (p.error.empty() && !(cache_id != 0 && cache_id == p.cache_id)) {
    p.error = Mismatch(p, request, rank);
  }
  p.submitted.Set(rank);
  ++p.count;
  if (p.timed) stragglers_.Requested(rank, now_ns_ - p.first_submit_ns);
  RecordTimeline(NegotiationEvent::Kind::kRankReady, request, rank, now);
  // first_dims exists only when the first rank asked for an allgather; a rank that asks for an
  // allgather against another type (a mismatch) must not index it.
  if (request.type == RequestType::kAllgather && !p.first_dims.empty()) {
    p.first_dims[rank] = request.shape[0];
  }
  if (AllSubmitted(p)) MarkReady(&p, now);
}

bool Negotiator::AllSubmitted(const Pending& p) const {
  const std::vector<int32_t>& members = p.request.process_set_ranks;
  if (!members.empty()) {  // a process set: its members alone
    if (joined_count_ == 0) return p.count == static_cast<int>(members.size());
    for (int32_t r : members) {
      if (!p.submitted[r] && !joined_[r]) return false;
    }
    return true;
  }
  if (joined_count_ == 0) return p.count == size_;
  for (int r = 0; r < size_; ++r) {
    if (!p.submitted[r] && !joined_[r]) return false;
  }
  return true;
}

void Negotiator::MarkReady(Pending* p, absl::Time now) {
  p->ready = true;
  --waiting_;
  RecordTimeline(NegotiationEvent::Kind::kEnd, p->request, -1, now);
  // As Horovod: only allreduce (a joined rank adds zeros) and barrier work while a rank of the
  // set has joined; the others fail on every rank.
  if (p->error.empty() && joined_count_ > 0 &&
      (p->request.type == RequestType::kAllgather || p->request.type == RequestType::kBroadcast)) {
    for (int r = 0; r < size_; ++r) {
      if (!joined_[r] || !InSet(p->request, r)) continue;
      p->error = absl::StrCat(
          p->request.type == RequestType::kAllgather
              ? "Allgather is not supported with Join at this time. Specify sparse_to_dense=True "
                "if using DistributedOptimizer"
              : "Broadcast is not supported with Join at this time.",
          " (tensor '", QuotedName(p->request.name), "'; ", RankName(r), " has joined)");
      break;
    }
  }
  if (first_ready_time_ == absl::InfiniteFuture()) first_ready_time_ = now;
  ready_bytes_ += ByteSize(*p);
  if (p->request.group_id > 0) {
    const std::pair<int32_t, int32_t> group(p->request.process_set_id, p->request.group_id);
    std::vector<Pending*>& members = group_ready_[group];
    members.push_back(p);
    if (static_cast<int>(members.size()) < p->request.group_size) return;
    ready_.push_back(Unit{std::move(members)});
    group_ready_.erase(group);
    return;
  }
  ready_.push_back(Unit{{p}});
}

void Negotiator::Join(int rank, const std::string& name, absl::Time now) {
  if (joined_[rank]) return;
  for (int r = 0; r < size_; ++r) {
    if (ended_[r].empty()) continue;
    std::string error = JoinNeverCompletes(r);
    if (ended_failure_.empty()) ended_failure_ = error;
    RankError(rank, name, std::move(error));
    return;
  }
  joined_[rank] = 1;
  join_names_[rank] = name;
  ++joined_count_;
  // Tensors that waited only for this rank are ready now; the rank contributes zeros.
  for (auto& [name, p] : pending_) {
    if (!p.ready && AllSubmitted(p)) MarkReady(&p, now);
  }
  if (joined_count_ == size_) {
    Unit unit;
    unit.join = true;
    unit.last_joined_rank = rank;
    ready_.push_back(std::move(unit));
    if (first_ready_time_ == absl::InfiniteFuture()) first_ready_time_ = now;
    joined_.assign(size_, 0);
    joined_count_ = 0;
  }
}

std::string Negotiator::NeverCompletes(const TensorRequest& r, int rank, bool submitted_by_it) {
  std::string type(RequestTypeName(r.type));
  if (!type.empty()) type[0] = static_cast<char>(absl::ascii_toupper(type[0]));
  return absl::StrCat(type, " of tensor '", QuotedName(r.name),
                      "' can never complete: ", ended_[rank],
                      submitted_by_it ? " with it in flight" : " before submitting it",
                      " (one of the ranks finished execution).");
}

int Negotiator::EndedRankOf(const TensorRequest& r) const {
  for (int e = 0; e < size_; ++e) {
    if (!ended_[e].empty() && InSet(r, e)) return e;
  }
  return -1;
}

void Negotiator::RankEnded(int rank, std::string why, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (!ended_[rank].empty()) return;
  ended_[rank] = why.empty() ? absl::StrCat(RankName(rank), " ended") : std::move(why);
  ++ended_count_;
  // In the order they were first submitted (then by name): a deterministic list.
  std::vector<Pending*> concerned;
  for (auto& [key, p] : pending_) {
    if (InSet(p.request, rank)) concerned.push_back(&p);
  }
  std::sort(concerned.begin(), concerned.end(), [](const Pending* a, const Pending* b) {
    return std::tie(a->first_submit, a->request.name) < std::tie(b->first_submit, b->request.name);
  });
  for (Pending* pending : concerned) {
    Pending& p = *pending;
    // Ringmaster's own background collectives (init's allgather of local sizes, which a rank
    // waits for only when it asks is_homogeneous()) fail without failing the job.
    const bool others_wait = p.count > (p.submitted[rank] ? 1 : 0) &&
                             !absl::StartsWith(p.request.name, kBackgroundPrefix);
    if (p.error.empty()) {
      p.error = NeverCompletes(p.request, rank, p.submitted[rank]);
      if (others_wait && ended_failure_.empty()) ended_failure_ = p.error;
    }
    // Ready and not yet sent: it would run without the rank's worker, which has left the job.
    if (!p.ready) MarkReady(&p, now);
  }
  // Ranks in a join wait for every rank: this one will never join.
  const std::string join_error = JoinNeverCompletes(rank);
  for (int r = 0; r < size_; ++r) {
    if (!joined_[r]) continue;
    joined_[r] = 0;
    --joined_count_;
    if (r == rank || !ended_[r].empty()) continue;
    RankError(r, join_names_[r], join_error);
    if (ended_failure_.empty()) ended_failure_ = join_error;
  }
}

std::string Negotiator::JoinNeverCompletes(int rank) const {
  return absl::StrCat("Join can never complete: ", ended_[rank],
                      " without joining (one of the ranks finished execution).");
}

std::string Negotiator::TakeEndedRankFailure() {
  absl::MutexLock lock(&mu_);
  std::string out;
  out.swap(ended_failure_);
  return out;
}

bool Negotiator::DueLocked(absl::Time now) const {
  if (has_notices_) return true;
  if (ready_.empty()) return false;
  return waiting_ == 0 || now >= first_ready_time_ + cycle_time_ ||
         (fusion_threshold_bytes_ > 0 && ready_bytes_ >= fusion_threshold_bytes_);
}

absl::Time Negotiator::NextDeadline() const {
  absl::MutexLock lock(&mu_);
  // Due whatever the time (notices, nothing partial, or a full fusion buffer): due now.
  if (DueLocked(absl::InfinitePast())) return absl::InfinitePast();
  if (ready_.empty()) return absl::InfiniteFuture();
  return first_ready_time_ + cycle_time_;
}

Response Negotiator::MakeResponse(const std::vector<Pending*>& tensors) const {
  Response out;
  const Pending& first = *tensors.front();
  const TensorRequest& r = first.request;
  for (const Pending* p : tensors) {
    if (!p->error.empty()) {
      out.type = Response::Type::kError;
      out.error_message = p->error;
    }
  }
  if (out.error_message.empty()) out.type = ResponseTypeOf(r.type);
  out.dtype = r.dtype;
  out.reduce_op = r.reduce_op;
  out.prescale_factor = r.prescale_factor;
  out.postscale_factor = r.postscale_factor;
  out.root_rank = r.root_rank;
  out.device = r.device;
  out.process_set_id = r.process_set_id;
  out.process_set_ranks = r.process_set_ranks;
  out.names.reserve(tensors.size());
  for (const Pending* p : tensors) {
    out.names.push_back(p->request.name);
    if (out.type == Response::Type::kAllgather && !r.process_set_ranks.empty()) {
      for (int32_t member : r.process_set_ranks) out.tensor_sizes.push_back(p->first_dims[member]);
      out.row_elements.push_back(
          p->request.shape.empty() ? 1
                                   : NumElements(absl::MakeConstSpan(p->request.shape).subspan(1)));
    } else if (out.type == Response::Type::kAllgather) {
      out.tensor_sizes.insert(out.tensor_sizes.end(), p->first_dims.begin(), p->first_dims.end());
      out.row_elements.push_back(
          p->request.shape.empty() ? 1
                                   : NumElements(absl::MakeConstSpan(p->request.shape).subspan(1)));
    } else if (out.type != Response::Type::kError) {
      out.tensor_sizes.push_back(NumElements(p->request.shape));
    }
  }
  return out;
}

// Most distinct tensor names counted for NegotiatorStats::distinct_tensors: far more than a step
// has, and few enough that a job naming every call anew keeps the coordinator flat (about 1 MB).
constexpr size_t kMaxDistinctTensors = size_t{1} << 14;

std::optional<CycleOutput> Negotiator::Poll(absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (!DueLocked(now)) return std::nullopt;
  CycleOutput out;
  out.notices.resize(size_);
  if (has_notices_) {
    out.notices.swap(notices_);
    notices_.resize(size_);
    has_notices_ = false;
  }

  // Fuse: take the first unit; pull in later compatible units while the total fits the threshold.
  // Units passed over keep their relative order, so every rank sees the same list.
  if (!evicted_.empty()) {
    out.evicted_ids = std::move(evicted_);
    evicted_.clear();
  }
  std::vector<Unit> units = std::move(ready_);
  ready_.clear();
  std::vector<uint8_t> taken(units.size(), 0);
  std::vector<std::vector<Pending*>> batches;
  for (size_t i = 0; i < units.size(); ++i) {
    if (taken[i]) continue;
    Unit& unit = units[i];
    if (unit.join) {
      Response join;
      join.type = Response::Type::kJoin;
      join.last_joined_rank = unit.last_joined_rank;
      batches.emplace_back();  // placeholder keeps order; filled below
      out.responses.push_back(std::move(join));
      continue;
    }
    std::vector<Pending*> batch = std::move(unit.tensors);
    const bool grouped = batch.front()->request.group_id > 0;
    const Pending& head = *batch.front();
    if (!grouped && fusion_threshold_bytes_ > 0 && head.error.empty() &&
        Fusable(head.request.type)) {
      int64_t bytes = ByteSize(head);
      // Horovod's look-ahead: pass over tensors that cannot join (another type, a group) only while
      // the fused and passed-over bytes together fit the threshold, and stop at the first tensor
      // that would overflow it. Tensors enqueued back to back in memory thus fuse into one
      // contiguous run, which the worker reduces in place.
      int64_t skipped = 0;
      for (size_t j = i + 1; j < units.size() && bytes < fusion_threshold_bytes_; ++j) {
        if (taken[j]) continue;
        const bool single = !units[j].join && units[j].tensors.size() == 1;
        const Pending* candidate = single ? units[j].tensors.front() : nullptr;
        const int64_t candidate_bytes = candidate != nullptr ? ByteSize(*candidate) : 0;
        if (candidate != nullptr && candidate->request.group_id == 0 &&
            Compatible(head, *candidate) && bytes + candidate_bytes <= fusion_threshold_bytes_) {
          bytes += candidate_bytes;
          batch.push_back(units[j].tensors.front());
          taken[j] = 1;
          continue;
        }
        skipped += candidate_bytes;
        if (bytes + skipped > fusion_threshold_bytes_) break;
      }
    }
    for (const Pending* p : batch) out.oldest_submit = std::min(out.oldest_submit, p->first_submit);
    out.responses.push_back(MakeResponse(batch));
    batches.push_back(std::move(batch));
  }

  // Response cache: successful tensors get (or keep) an id; a response names a tensor by id when
  // the id is still valid at the end of the cycle.
  absl::flat_hash_map<std::string, uint32_t> assigned;
  for (size_t b = 0; b < batches.size(); ++b) {
    const bool ok = out.responses[b].type != Response::Type::kError &&
                    out.responses[b].type != Response::Type::kJoin;
    for (Pending* p : batches[b]) {
      // Allgather is not cached: its first dimension differs per rank. Nor are a process set's
      // collectives: the cache is the job's, by name, and sets name their tensors on their own.
      if (!ok || p->request.type == RequestType::kAllgather ||
          !p->request.process_set_ranks.empty()) {
        continue;
      }
      if (p->cache_id != 0 && cache_.Lookup(p->cache_id) != nullptr) {
        cache_.Touch(p->cache_id);
        ++stats_.cache_hits;
        continue;
      }
      ++stats_.cache_misses;
      // A cache hit was negotiated (and counted) before; a miss may be new.
      // Allreduces only: broadcasts are mostly one-off (parameters at the start) and would make a
      // "step" look longer than it is. Bounded: a job that names every call anew (Horovod's
      // "allreduce.noname.N") has no steps.
      if (p->request.type == RequestType::kAllreduce && seen_.size() < kMaxDistinctTensors) {
        seen_.insert(p->request.name);
        stats_.distinct_tensors = static_cast<int64_t>(seen_.size());
      }
      const uint32_t existing = cache_.IdOf(p->request.name);
      if (existing != 0 && *cache_.Lookup(existing) == p->request) {
        cache_.Touch(existing);
        p->cache_id = existing;
        continue;
      }
      p->cache_id = cache_enabled_ ? cache_.Put(p->request, &out.evicted_ids) : 0;
      if (p->cache_id != 0) assigned[p->request.name] = p->cache_id;
    }
  }
  for (size_t b = 0; b < batches.size(); ++b) {
    Response& response = out.responses[b];
    if (response.type == Response::Type::kJoin) continue;
    response.cache_ids.assign(batches[b].size(), 0);
    for (size_t t = 0; t < batches[b].size(); ++t) {
      const Pending* p = batches[b][t];
      if (response.type != Response::Type::kError && p->cache_id != 0 &&
          cache_.Lookup(p->cache_id) != nullptr) {
        response.cache_ids[t] = p->cache_id;
        // Ids assigned this cycle travel with their name in cache_assignments.
        response.names[t].clear();
      }
    }
    stats_.tensors_negotiated += static_cast<int64_t>(batches[b].size());
  }
  for (auto& [name, id] : assigned) {
    if (cache_.Lookup(id) != nullptr) out.cache_assignments.push_back({name, id});
  }
  std::sort(out.cache_assignments.begin(), out.cache_assignments.end(),
            [](const CacheAssignment& a, const CacheAssignment& b) { return a.id < b.id; });

  ForgetIds(out.evicted_ids);
  for (const auto& batch : batches) {
    std::string key_storage;
    for (const Pending* p : batch) {
      if (p->indexed_id != 0) {
        if (auto it = pending_by_id_.find(p->indexed_id);
            it != pending_by_id_.end() && it->second == p) {
          pending_by_id_.erase(it);
        }
      }
      pending_.erase(PendingKey(p->request, key_storage));
    }
  }
  ready_bytes_ = 0;
  first_ready_time_ = absl::InfiniteFuture();
  ++stats_.cycles;
  return out;
}

StallReport Negotiator::CheckStalls(absl::Time now) {
  absl::MutexLock lock(&mu_);
  StallReport report;
  if (stall_check_ == absl::ZeroDuration()) return report;
  std::map<int, std::vector<std::string>> missing;  // rank -> tensor names, ordered
  absl::Duration longest;
  bool fresh = false;
  for (auto& [name, p] : pending_) {
    if (p.ready) continue;
    const absl::Duration waited = now - p.first_submit;
    if (waited < stall_check_) continue;
    ++report.stalled;
    longest = std::max(longest, waited);
    if (stall_shutdown_ > absl::ZeroDuration() && waited >= stall_shutdown_) report.shutdown = true;
    if (now - p.last_stall_report < stall_check_) continue;
    p.last_stall_report = now;
    fresh = true;
    for (int r = 0; r < size_; ++r) {
      if (!p.submitted[r] && !joined_[r] && InSet(p.request, r)) missing[r].push_back(name);
    }
  }
  if (!fresh && !report.shutdown) return report;
  if (!fresh) {
    // Shutdown without a new report: name everything stalled.
    for (auto& [name, p] : pending_) {
      if (p.ready || now - p.first_submit < stall_check_) continue;
      for (int r = 0; r < size_; ++r) {
        if (!p.submitted[r] && !joined_[r] && InSet(p.request, r)) missing[r].push_back(name);
      }
    }
  }
  std::vector<std::string> parts;
  for (auto& [rank, names] : missing) {
    std::sort(names.begin(), names.end());
    const size_t total = names.size();
    if (total > kMaxStallNamesPerRank) names.resize(kMaxStallNamesPerRank);
    std::string part = absl::StrCat(
        RankName(rank),
        ended_[rank].empty() ? " has not submitted " : " has exited and never submitted ",
        absl::StrJoin(names, ", ",
                      [](std::string* out, const auto& n) { absl::StrAppend(out, "'", n, "'"); }));
    if (total > names.size()) absl::StrAppend(&part, " and ", total - names.size(), " more");
    parts.push_back(std::move(part));
  }
  report.message = absl::StrCat(
      "Stalled collectives in job ", job_id_, ": tensors submitted by some ranks have waited ",
      absl::FormatDuration(absl::Trunc(longest, absl::Seconds(1))), " for the others (",
      absl::StrJoin(parts, "; "), ").",
      report.shutdown ? " Stall shutdown time exceeded: failing the job." : "");
  return report;
}

void Negotiator::SetParameters(int64_t fusion_threshold_bytes, absl::Duration cycle_time) {
  absl::MutexLock lock(&mu_);
  fusion_threshold_bytes_ = fusion_threshold_bytes;
  cycle_time_ = cycle_time;
}

void Negotiator::SetCacheEnabled(bool enabled) {
  absl::MutexLock lock(&mu_);
  if (enabled == cache_enabled_) return;
  cache_enabled_ = enabled;
  if (!enabled) {
    cache_.Clear(&evicted_);
    ForgetIds(evicted_);
  }
  has_notices_ = has_notices_ || !evicted_.empty();  // the eviction is news: send a cycle
}

bool Negotiator::cache_enabled() const {
  absl::MutexLock lock(&mu_);
  return cache_enabled_;
}

void Negotiator::RecordTimeline(NegotiationEvent::Kind kind, const TensorRequest& request,
                                int32_t rank, absl::Time now) {
  if (!record_timeline_) return;
  // Ranks' batches take their time before they take the lock: one taken later may carry an earlier
  // time. The timeline keeps events in the order they happened here, so times never go back.
  last_timeline_time_ = std::max(last_timeline_time_, now);
  timeline_.push_back({kind, request.name, request.type, rank, last_timeline_time_, 0, {}});
}

void Negotiator::RecordStep(const StragglerTracker::StepEnd& end, absl::Time now) {
  if (!record_timeline_) return;
  last_timeline_time_ = std::max(last_timeline_time_, now);
  NegotiationEvent e;
  e.kind = NegotiationEvent::Kind::kStepEnd;
  e.name = kStepsTimelineRow;
  e.rank = end.last_rank;
  e.time = last_timeline_time_;
  e.step = end.step;
  e.lateness = end.lateness;
  timeline_.push_back(std::move(e));
}

StragglerTracker::Report Negotiator::Stragglers() const {
  absl::MutexLock lock(&mu_);
  return stragglers_.Window();
}

std::vector<NegotiationEvent> Negotiator::DrainTimeline() {
  absl::MutexLock lock(&mu_);
  std::vector<NegotiationEvent> out;
  out.swap(timeline_);
  return out;
}

int64_t Negotiator::fusion_threshold_bytes() const {
  absl::MutexLock lock(&mu_);
  return fusion_threshold_bytes_;
}

absl::Duration Negotiator::cycle_time() const {
  absl::MutexLock lock(&mu_);
  return cycle_time_;
}

NegotiatorStats Negotiator::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace ringmaster
