// Run as every rank of a job (`ringmaster local --np N -- collectives_check`): each collective ×
// data type on pseudo-random data against a reference computed exactly from every rank's inputs
// (each rank can regenerate the others' data from the seeds), enqueued asynchronously in a
// rank-dependent order; then the errors a user relies on (mismatch, duplicate name), join and
// barrier. Prints one line per failure and "collectives_check: rank R: N checks passed"; exits 0
// only if all pass.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/half.h"
#include "ringmaster/client.h"

namespace {

using ringmaster::AllgatherOutput;
using ringmaster::Client;
using ringmaster::DataType;
using ringmaster::Handle;
using ringmaster::ReduceOp;

int g_failures = 0;
int g_checks = 0;
int g_rank = 0;

void Check(bool ok, const std::string& what) {
  ++g_checks;
  if (!ok) {
    ++g_failures;
    std::printf("FAIL rank %d: %s\n", g_rank, what.c_str());
  }
}

const std::vector<DataType> kTypes = {DataType::kUint8,   DataType::kInt8,    DataType::kInt32,
                                      DataType::kInt64,   DataType::kFloat16, DataType::kBfloat16,
                                      DataType::kFloat32, DataType::kFloat64};
const std::vector<ReduceOp> kOps = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin,
                                    ReduceOp::kMax, ReduceOp::kProduct};
const std::vector<std::vector<int64_t>> kShapes = {{7}, {3, 5}, {2, 3, 4}};

// Value i of rank r's tensor `seed`: small numbers every type holds exactly, and their sums over up
// to 16 ranks too. For products, ranks from 4 on contribute -1 or 1, so that every product is at
// most 81 in magnitude, whatever the number of ranks.
double Value(int rank, uint64_t seed, int64_t i, DataType t, ReduceOp op) {
  std::mt19937_64 rng(seed * 7919 + rank * 104729 + i);
  const bool is_unsigned = t == DataType::kUint8;
  const int lo = is_unsigned ? 0 : -3, hi = 3;
  double v = lo + static_cast<int>(rng() % (hi - lo + 1));
  const bool is_float = t == DataType::kFloat16 || t == DataType::kBfloat16 ||
                        t == DataType::kFloat32 || t == DataType::kFloat64;
  if (is_float && op != ReduceOp::kProduct) v += 0.25 * static_cast<int>(rng() % 4);
  if (op == ReduceOp::kProduct && v == 0) v = 1;
  if (op == ReduceOp::kProduct && rank >= 4) v = v < 0 ? -1 : 1;
  return v;
}

void Store(void* p, int64_t i, DataType t, double v) {
  switch (t) {
    case DataType::kUint8:
      static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v);
      break;
    case DataType::kInt8:
      static_cast<int8_t*>(p)[i] = static_cast<int8_t>(v);
      break;
    case DataType::kInt32:
      static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
      break;
    case DataType::kInt64:
      static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
      break;
    case DataType::kFloat16:
      static_cast<uint16_t*>(p)[i] = ringmaster::FloatToHalf(v);
      break;
    case DataType::kBfloat16:
      static_cast<uint16_t*>(p)[i] = ringmaster::FloatToBfloat16(v);
      break;
    case DataType::kFloat32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      break;
    case DataType::kFloat64:
      static_cast<double*>(p)[i] = v;
      break;
    default:
      break;
  }
}

double Load(const void* p, int64_t i, DataType t) {
  switch (t) {
    case DataType::kUint8:
      return static_cast<const uint8_t*>(p)[i];
    case DataType::kInt8:
      return static_cast<const int8_t*>(p)[i];
    case DataType::kInt32:
      return static_cast<const int32_t*>(p)[i];
    case DataType::kInt64:
      return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DataType::kFloat16:
      return ringmaster::HalfToFloat(static_cast<const uint16_t*>(p)[i]);
    case DataType::kBfloat16:
      return ringmaster::Bfloat16ToFloat(static_cast<const uint16_t*>(p)[i]);
    case DataType::kFloat32:
      return static_cast<const float*>(p)[i];
    case DataType::kFloat64:
      return static_cast<const double*>(p)[i];
    default:
      return 0;
  }
}

bool IsInt(DataType t) {
  return t == DataType::kUint8 || t == DataType::kInt8 || t == DataType::kInt32 ||
         t == DataType::kInt64;
}

double Reduce(ReduceOp op, DataType t, int size, const std::function<double(int)>& value) {
  double acc = value(0);
  for (int r = 1; r < size; ++r) {
    const double v = value(r);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAverage:
        acc += v;
        break;
      case ReduceOp::kMin:
        acc = std::min(acc, v);
        break;
      case ReduceOp::kMax:
        acc = std::max(acc, v);
        break;
      case ReduceOp::kProduct:
        acc *= v;
        break;
      default:
        break;
    }
  }
  if (op == ReduceOp::kAverage) acc = IsInt(t) ? std::trunc(acc / size) : acc / size;
  return acc;
}

// Whether `got` is the reduction `want` as type `t` holds it: exactly, except for the average of a
// floating-point type over a number of ranks that is not a power of two, whose quotient the type
// cannot hold; that may be off by one unit in the last place of `t`.
bool Matches(double got, double want, DataType t, ReduceOp op, int size) {
  if (got == want) return true;
  if (op != ReduceOp::kAverage || IsInt(t) || (size & (size - 1)) == 0 || want == 0) return false;
  const int mantissa = t == DataType::kFloat16    ? 10
                       : t == DataType::kBfloat16 ? 7
                       : t == DataType::kFloat32  ? 23
                                                  : 52;
  return std::fabs(got - want) <= std::ldexp(1.0, std::ilogb(want) - mantissa);
}

struct Pending {
  Handle handle;
  std::string name;
  std::function<void()> verify;
};

}  // namespace

int main() {
  auto connected = Client::Connect();
  if (!connected.ok()) {
    std::printf("FAIL connect: %s\n", connected.status().ToString().c_str());
    return 1;
  }
  Client& c = **connected;
  const int rank = c.rank(), size = c.size();
  g_rank = rank;
  std::vector<Pending> pending;
  std::vector<std::function<void()>> enqueues;
  std::vector<std::vector<uint8_t>> heap;  // tensors outside the arena (staged by the client)

  uint64_t seed = 0;
  for (DataType t : kTypes) {
    const int64_t elem = ringmaster::DataTypeSize(t);
    for (ReduceOp op : kOps) {
      for (size_t s = 0; s < kShapes.size(); ++s) {
        const std::vector<int64_t> shape = kShapes[s];
        int64_t n = 1;
        for (int64_t d : shape) n *= d;
        const uint64_t id = ++seed;
        const bool in_arena = id % 2 == 0;
        void* data;
        if (in_arena) {
          data = c.Allocate(n * elem);
        } else {
          heap.emplace_back(n * elem);
          data = heap.back().data();
        }
        for (int64_t i = 0; i < n; ++i) Store(data, i, t, Value(rank, id, i, t, op));
        const std::string name = absl::StrCat("allreduce.", id);
        enqueues.push_back([&, data, t, op, shape, n, id, name] {
          auto h = c.AllreduceAsync(name, data, t, shape, op);
          if (!h.ok()) return Check(false, absl::StrCat(name, " enqueue: ", h.status().ToString()));
          pending.push_back(
              {*h, name, [=] {
                 for (int64_t i = 0; i < n; ++i) {
                   const double want =
                       Reduce(op, t, size, [&](int r) { return Value(r, id, i, t, op); });
                   const double got = Load(data, i, t);
                   if (!Matches(got, want, t, op, size)) {
                     return Check(false, absl::StrCat(name, " dtype ", static_cast<int>(t), " op ",
                                                      static_cast<int>(op), " [", i, "] = ", got,
                                                      ", want ", want));
                   }
                 }
                 Check(true, name);
               }});
        });
      }
    }
    // Broadcast from every root.
    for (int root = 0; root < size; ++root) {
      const uint64_t id = ++seed;
      const int64_t n = 11;
      void* data = c.Allocate(n * elem);
      for (int64_t i = 0; i < n; ++i) Store(data, i, t, Value(rank, id, i, t, ReduceOp::kSum));
      const std::string name = absl::StrCat("broadcast.", id);
      enqueues.push_back([&, data, t, n, id, root, name] {
        auto h = c.BroadcastAsync(name, data, t, {n}, root);
        if (!h.ok()) return Check(false, absl::StrCat(name, " enqueue: ", h.status().ToString()));
        pending.push_back({*h, name, [=] {
                             for (int64_t i = 0; i < n; ++i) {
                               const double want = Value(root, id, i, t, ReduceOp::kSum);
                               if (Load(data, i, t) != want) {
                                 return Check(
                                     false, absl::StrCat(name, " from root ", root, " [", i, "]"));
                               }
                             }
                             Check(true, name);
                           }});
      });
    }
    // Allgather: rank r contributes r+1 rows of 3 (rank 1 none when size > 2).
    {
      const uint64_t id = ++seed;
      auto rows_of = [size](int r) -> int64_t { return size > 2 && r == 1 ? 0 : r + 1; };
      const int64_t rows = rows_of(rank);
      heap.emplace_back(std::max<int64_t>(1, rows * 3 * elem));
      void* data = heap.back().data();
      for (int64_t i = 0; i < rows * 3; ++i)
        Store(data, i, t, Value(rank, id, i, t, ReduceOp::kSum));
      const std::string name = absl::StrCat("allgather.", id);
      enqueues.push_back([&, data, t, id, rows, name, rows_of] {
        auto h = c.AllgatherAsync(name, data, t, {rows, 3});
        if (!h.ok()) return Check(false, absl::StrCat(name, " enqueue: ", h.status().ToString()));
        const Handle handle = *h;
        pending.push_back(
            {handle, name, [=, &c] {
               auto out = c.TakeAllgather(handle);
               if (!out.ok())
                 return Check(false, absl::StrCat(name, ": ", out.status().ToString()));
               int64_t total = 0;
               for (int r = 0; r < size; ++r) total += rows_of(r);
               if (out->shape != std::vector<int64_t>{total, 3}) {
                 return Check(
                     false, absl::StrCat(name, " shape [", out->shape.empty() ? -1 : out->shape[0],
                                         ", ...]"));
               }
               int64_t at = 0;
               for (int r = 0; r < size; ++r) {
                 for (int64_t i = 0; i < rows_of(r) * 3; ++i, ++at) {
                   if (Load(out->data.data(), at, t) != Value(r, id, i, t, ReduceOp::kSum)) {
                     return Check(false, absl::StrCat(name, " row from rank ", r));
                   }
                 }
               }
               Check(true, name);
             }});
      });
    }
  }
  // Pre- and postscale on float32: (2 * x summed) * 0.25.
  {
    const uint64_t id = ++seed;
    const int64_t n = 9;
    float* data = static_cast<float*>(c.Allocate(n * 4));
    for (int64_t i = 0; i < n; ++i)
      data[i] = Value(rank, id, i, DataType::kFloat32, ReduceOp::kSum);
    enqueues.push_back([&, data, id] {
      auto h = c.AllreduceAsync("scaled", data, DataType::kFloat32, {n}, ReduceOp::kSum, 2.0, 0.25);
      if (!h.ok()) return Check(false, "scaled enqueue");
      pending.push_back({*h, "scaled", [=] {
                           for (int64_t i = 0; i < n; ++i) {
                             double want = 0;
                             for (int r = 0; r < size; ++r)
                               want += 2.0 * Value(r, id, i, DataType::kFloat32, ReduceOp::kSum);
                             if (data[i] != static_cast<float>(want * 0.25))
                               return Check(false, "scaled");
                           }
                           Check(true, "scaled");
                         }});
    });
  }

  // Each rank enqueues in its own order: rank r rotates the list by r * 7 (and odd ranks reverse).
  std::rotate(enqueues.begin(), enqueues.begin() + (rank * 7) % enqueues.size(), enqueues.end());
  if (rank % 2 == 1) std::reverse(enqueues.begin(), enqueues.end());
  for (auto& e : enqueues) e();
  for (Pending& p : pending) {
    absl::Status s = c.Wait(p.handle, absl::Seconds(60));
    if (!s.ok()) {
      Check(false, absl::StrCat(p.name, ": ", s.ToString()));
      continue;
    }
    p.verify();
  }

  // A grouped allreduce (mixed sizes, one tensor outside the arena) completes as one group, every
  // tensor exactly, with fusion on or off.
  {
    std::vector<std::vector<float>> parts = {std::vector<float>(5), std::vector<float>(300)};
    float* in_arena = static_cast<float*>(c.Allocate(17 * 4));
    std::vector<void*> data = {parts[0].data(), parts[1].data(), in_arena};
    std::vector<std::vector<int64_t>> shapes = {{5}, {30, 10}, {17}};
    for (int t = 0; t < 3; ++t) {
      for (int64_t i = 0; i < shapes[t][0] * (t == 1 ? 10 : 1); ++i) {
        static_cast<float*>(data[t])[i] =
            Value(rank, 900 + t, i, DataType::kFloat32, ReduceOp::kSum);
      }
    }
    auto hs = c.GroupedAllreduceAsync({"group.a", "group.b", "group.c"}, data, DataType::kFloat32,
                                      shapes, ReduceOp::kSum);
    bool ok = hs.ok();
    for (size_t t = 0; ok && t < hs->size(); ++t) ok = c.Wait((*hs)[t], absl::Seconds(30)).ok();
    for (int t = 0; ok && t < 3; ++t) {
      for (int64_t i = 0; i < shapes[t][0] * (t == 1 ? 10 : 1); ++i) {
        double want = 0;
        for (int r = 0; r < size; ++r)
          want += Value(r, 900 + t, i, DataType::kFloat32, ReduceOp::kSum);
        if (static_cast<float*>(data[t])[i] != static_cast<float>(want)) ok = false;
      }
    }
    Check(ok, absl::StrCat("grouped allreduce", hs.ok() ? "" : hs.status().ToString()));
  }

  // A mismatch fails exactly that op, on every rank, with the coordinator's message; an op in
  // flight beside it completes.
  {
    float* bad = static_cast<float*>(c.Allocate(64 * 4));
    float* good = static_cast<float*>(c.Allocate(4 * 4));
    for (int i = 0; i < 4; ++i) good[i] = 1;
    const int64_t cols = rank == 0 ? 3 : 4;
    auto hb = c.AllreduceAsync("mismatch", bad, DataType::kFloat32, {2, cols}, ReduceOp::kSum);
    auto hg = c.AllreduceAsync("beside", good, DataType::kFloat32, {4}, ReduceOp::kSum);
    absl::Status sb = hb.ok() ? c.Wait(*hb, absl::Seconds(30)) : hb.status();
    absl::Status sg = hg.ok() ? c.Wait(*hg, absl::Seconds(30)) : hg.status();
    const std::string m = std::string(sb.message());
    const bool named =
        m.rfind("Mismatched allreduce tensor shapes for tensor 'mismatch': rank ", 0) == 0 &&
        m.find("sent [2, 3]") != std::string::npos && m.find("sent [2, 4]") != std::string::npos;
    Check(sb.code() == absl::StatusCode::kFailedPrecondition && named,
          absl::StrCat("mismatch error: ", sb.ToString()));
    Check(sg.ok() && good[0] == size, absl::StrCat("op beside the mismatch: ", sg.ToString()));
  }
  // A name already in flight is refused at once, naming the rank and host. Rank 0 submits its "dup"
  // only after the barrier, so on every other rank the first "dup" is surely still in flight when
  // the second arrives (it cannot complete without rank 0).
  {
    float* a = static_cast<float*>(c.Allocate(16));
    absl::StatusOr<Handle> h1 = absl::UnavailableError("not submitted");
    if (rank != 0) {
      h1 = c.AllreduceAsync("dup", a, DataType::kFloat32, {4});
      auto h2 = c.AllreduceAsync("dup", a, DataType::kFloat32, {4});
      absl::Status s2 = h2.ok() ? c.Wait(*h2, absl::Seconds(30)) : h2.status();
      Check(s2.code() == absl::StatusCode::kInvalidArgument &&
                s2.message() == absl::StrCat("Tensor 'dup' is already in flight on rank ", rank,
                                             " (", c.topology().host,
                                             "): wait for it to complete before submitting it "
                                             "again, or use a different name."),
            absl::StrCat("duplicate name: ", s2.ToString()));
    }
    Check(c.Barrier().ok(), "barrier before rank 0's dup");
    if (rank == 0) h1 = c.AllreduceAsync("dup", a, DataType::kFloat32, {4});
    Check(h1.ok() && c.Wait(*h1, absl::Seconds(30)).ok(), "first of the duplicate names");
  }
  Check(c.Barrier().ok(), "barrier");
  // A small allreduce over and over, as a latency loop does: once cached, the ranks of a one-host
  // job negotiate it among their daemons (local negotiation). Its value changes every time; now
  // and then a rank lags, or two tensors are in flight at once, enqueued in opposite orders on odd
  // and even ranks (they then go to the coordinator), or an average comes in between.
  {
    float* x = static_cast<float*>(c.Allocate(2 * 4));
    float* y = static_cast<float*>(c.Allocate(2 * 4));
    float* avg = static_cast<float*>(c.Allocate(4));
    auto wait = [&](absl::StatusOr<Handle> h) { return h.ok() ? c.Wait(*h) : h.status(); };
    const float ranks_sum = static_cast<float>(size * (size - 1) / 2);
    std::string first_bad;
    for (int i = 0; i < 300 && first_bad.empty(); ++i) {
      if (i % 37 == rank) absl::SleepFor(absl::Milliseconds(3));
      x[0] = static_cast<float>(rank + i);
      x[1] = static_cast<float>(-i);
      absl::Status s;
      if (i % 11 == 5) {
        y[0] = static_cast<float>(2 * rank + i);
        y[1] = 1;
        const bool odd = rank % 2 == 1;
        absl::StatusOr<Handle> h1 = c.AllreduceAsync(odd ? "loop.y" : "loop.x", odd ? y : x,
                                                     DataType::kFloat32, {2}, ReduceOp::kSum);
        absl::StatusOr<Handle> h2 = c.AllreduceAsync(odd ? "loop.x" : "loop.y", odd ? x : y,
                                                     DataType::kFloat32, {2}, ReduceOp::kSum);
        s = wait(h1);
        if (absl::Status s2 = wait(h2); s.ok()) s = s2;
        if (s.ok() && (y[0] != 2 * ranks_sum + static_cast<float>(size * i) ||
                       y[1] != static_cast<float>(size))) {
          first_bad = absl::StrCat("loop.y at ", i, " = ", y[0], ", ", y[1]);
        }
      } else {
        s = wait(c.AllreduceAsync("loop.x", x, DataType::kFloat32, {2}, ReduceOp::kSum));
      }
      if (!s.ok()) first_bad = absl::StrCat("loop at ", i, ": ", s.ToString());
      if (first_bad.empty() && (x[0] != ranks_sum + static_cast<float>(size * i) ||
                                x[1] != static_cast<float>(-size * i))) {
        first_bad = absl::StrCat("loop.x at ", i, " = ", x[0], ", ", x[1]);
      }
      if (first_bad.empty() && i % 5 == 0) {
        *avg = static_cast<float>(rank + i);
        s = wait(c.AllreduceAsync("loop.avg", avg, DataType::kFloat32, {1}, ReduceOp::kAverage));
        if (!s.ok() ||
            !Matches(*avg, ranks_sum / size + i, DataType::kFloat32, ReduceOp::kAverage, size)) {
          first_bad = absl::StrCat("loop.avg at ", i, " = ", *avg, " ", s.ToString());
        }
      }
    }
    Check(first_bad.empty(), absl::StrCat("a small allreduce 300 times: ", first_bad));
  }
  // Join: every rank but the last joins at once; the last allreduces alone (the joined ranks
  // contribute zeros), then joins. Everyone learns the last rank to join.
  if (rank != size - 1) {
    auto last = c.Join();
    Check(last.ok() && *last == size - 1,
          absl::StrCat("join: ", last.ok() ? absl::StrCat(*last) : last.status().ToString()));
  } else {
    float* ones = static_cast<float*>(c.Allocate(8 * 4));
    for (int i = 0; i < 8; ++i) ones[i] = 1;
    auto h = c.AllreduceAsync("while_others_joined", ones, DataType::kFloat32, {8}, ReduceOp::kSum);
    absl::Status s = h.ok() ? c.Wait(*h, absl::Seconds(30)) : h.status();
    Check(s.ok() && ones[0] == 1 && ones[7] == 1,
          absl::StrCat("allreduce with joined ranks: ", s.ToString()));
    // An allgather while the others have joined fails, as in Horovod (on every rank: the joined
    // ones have no operation of it), and the next allreduce works.
    float* rows = static_cast<float*>(c.Allocate(3 * 4 * 4));
    for (int i = 0; i < 12; ++i) rows[i] = static_cast<float>(i);
    auto g = c.AllgatherAsync("rows_while_others_joined", rows, DataType::kFloat32, {3, 4});
    absl::Status gs = g.ok() ? c.Wait(*g, absl::Seconds(30)) : g.status();
    Check(gs.code() == absl::StatusCode::kFailedPrecondition &&
              absl::StartsWith(gs.message(),
                               "Allgather is not supported with Join at this time. Specify "
                               "sparse_to_dense=True if using DistributedOptimizer (tensor "
                               "'rows_while_others_joined'; rank 0 ("),
          absl::StrCat("2-D allgather with joined ranks: ", gs.ToString()));
    for (int i = 0; i < 8; ++i) ones[i] = 2;
    h = c.AllreduceAsync("after_refused_allgather", ones, DataType::kFloat32, {8}, ReduceOp::kSum);
    s = h.ok() ? c.Wait(*h, absl::Seconds(30)) : h.status();
    Check(s.ok() && ones[0] == 2 && ones[7] == 2,
          absl::StrCat("allreduce after the refused allgather: ", s.ToString()));
    auto last = c.Join();
    Check(last.ok() && *last == size - 1, "join (last)");
  }
  std::printf("collectives_check: rank %d: %d checks passed, %d failed\n", rank,
              g_checks - g_failures, g_failures);
  c.Shutdown();
  return g_failures == 0 ? 0 : 1;
}
