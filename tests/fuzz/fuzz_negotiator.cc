// Fuzz target: the negotiator fed by ranks that send anything: each input is a script of submits
// (any type, dtype, shape, root, group, by name or by cache id), polls and stall checks, with
// time moving on. Every response it produces must name tensors some rank submitted.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/negotiator.h"

namespace {

class Script {
 public:
  Script(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool more() const { return pos_ < size_; }
  uint8_t next() { return pos_ < size_ ? data_[pos_++] : 0; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ringmaster;
  Script s(data, size);
  const int np = 1 + s.next() % 4;
  NegotiatorOptions options;
  options.job_id = "job-000001";
  for (int r = 0; r < np; ++r) options.rank_hosts.push_back(absl::StrCat("h", r % 2));
  options.fusion_threshold_bytes = int64_t{s.next()} << 8;
  options.cache_capacity = s.next() % 8;
  options.record_timeline = s.next() % 2 == 0;
  options.stall_shutdown = absl::Seconds(s.next() % 3);
  Negotiator n(options);
  absl::Time now = absl::UnixEpoch();
  for (int step = 0; step < 4096 && s.more(); ++step) {
    switch (s.next() % 5) {
      case 0:
      case 1: {  // a rank submits a few requests
        const int rank = s.next() % np;
        std::vector<TensorRequest> batch(1 + s.next() % 3);
        for (TensorRequest& r : batch) {
          r.name = absl::StrCat("t", s.next() % 16);
          r.type = static_cast<RequestType>(s.next() % 7);
          r.dtype = static_cast<DataType>(s.next() % 12);
          const int dims = s.next() % 4;
          for (int d = 0; d < dims; ++d) r.shape.push_back(static_cast<int8_t>(s.next()));
          r.root_rank = static_cast<int8_t>(s.next()) % (np + 2);
          r.reduce_op = static_cast<ReduceOp>(s.next() % 8);
          r.prescale_factor = s.next() % 3;
          r.group_id = s.next() % 3;
          r.group_size = s.next() % 4;
        }
        n.Submit(rank, std::move(batch), {}, now);
        break;
      }
      case 2: {  // by response-cache id
        const int rank = s.next() % np;
        const uint32_t ids[] = {static_cast<uint32_t>(s.next() % 10)};
        n.Submit(rank, {}, ids, now);
        break;
      }
      case 3: {
        now += absl::Milliseconds(s.next());
        if (std::optional<CycleOutput> out = n.Poll(now)) {
          for (const Response& r : out->responses) {
            if (r.names.size() != r.cache_ids.size()) std::abort();
          }
          if (out->notices.size() != static_cast<size_t>(np)) std::abort();
        }
        break;
      }
      case 4:
        now += absl::Seconds(s.next() % 90);
        (void)n.CheckStalls(now);
        (void)n.DrainTimeline();
        break;
    }
  }
  return 0;
}
