#include "coordinator/timeline.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"

namespace ringmaster {
namespace {

constexpr int kNegotiationThread = 0;
// Execution of rank r is thread 1 + r.

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

bool WriteAllAt(int fd, const std::string& data, int64_t offset) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = pwrite(fd, data.data() + done, data.size() - done, offset + done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Timeline>> Timeline::Create(const std::string& path,
                                                           std::string title, bool mark_cycles,
                                                           absl::Time start) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot create timeline ", path, ": ", std::strerror(errno)));
  }
  std::string empty = absl::StrCat("[", kTail);
  if (!WriteAllAt(fd, empty, 0)) {
    const int error = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot write timeline ", path, ": ", std::strerror(error)));
  }
  return std::unique_ptr<Timeline>(new Timeline(path, fd, std::move(title), mark_cycles, start));
}

Timeline::Timeline(std::string path, int fd, std::string title, bool mark_cycles, absl::Time start)
    : path_(std::move(path)),
      fd_(fd),
      title_(std::move(title)),
      mark_cycles_(mark_cycles),
      start_(start) {
  writer_ = std::thread([this] { Run(); });
}

Timeline::~Timeline() {
  Close();
  close(fd_);
}

void Timeline::Negotiation(std::vector<NegotiationEvent> events) {
  if (events.empty()) return;
  absl::MutexLock lock(&mu_);
  if (closing_) return;
  queue_.push_back(Item{.kind = Item::Kind::kNegotiation, .negotiation = std::move(events)});
}

void Timeline::Execution(int32_t rank, std::vector<ExecutionSpan> spans, int64_t skew_us) {
  if (spans.empty()) return;
  absl::MutexLock lock(&mu_);
  if (closing_) return;
  auto [it, first] = offset_us_.try_emplace(rank, 0);
  if (first && (skew_us >= 1'000'000 || skew_us <= -1'000'000)) it->second = skew_us;
  if (const int64_t offset = it->second; offset != 0) {
    for (ExecutionSpan& span : spans) {
      span.start_unix_us += offset;
      for (auto& [activity, end] : span.activities) end += offset;
    }
  }
  queue_.push_back(
      Item{.kind = Item::Kind::kExecution, .rank = rank, .execution = std::move(spans)});
}

void Timeline::Cycle(absl::Time time) {
  if (!mark_cycles_) return;
  absl::MutexLock lock(&mu_);
  if (closing_) return;
  queue_.push_back(Item{.kind = Item::Kind::kCycle, .time = time});
}

void Timeline::Close() {
  absl::MutexLock close_lock(&close_mu_);
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
  }
  if (writer_.joinable()) writer_.join();
}

int64_t Timeline::Micros(absl::Time t) const { return absl::ToInt64Microseconds(t - start_); }

int64_t Timeline::MicrosFromUnix(int64_t unix_us) const {
  return unix_us - absl::ToUnixMicros(start_);
}

void Timeline::Append(std::string* out, const std::string& event) {
  absl::StrAppend(out, any_event_ || !out->empty() ? ",\n" : "\n", event);
}

int Timeline::Row(const std::string& tensor, std::string* out) {
  auto [it, inserted] = rows_.try_emplace(tensor, static_cast<int>(rows_.size()) + 1);
  if (inserted) {
    const int pid = it->second;
    Append(out, absl::StrCat(R"({"name": "process_name", "ph": "M", "pid": )", pid,
                             R"(, "args": {"name": )", JsonString(tensor), "}}"));
    Append(out, absl::StrCat(R"({"name": "process_sort_index", "ph": "M", "pid": )", pid,
                             R"(, "args": {"sort_index": )", pid, "}}"));
    Append(out, absl::StrCat(R"({"name": "thread_name", "ph": "M", "pid": )", pid,
                             R"(, "tid": 0, "args": {"name": "negotiation"}})"));
  }
  return it->second;
}

void Timeline::Format(const Item& item, std::string* out) {
  switch (item.kind) {
    case Item::Kind::kNegotiation:
      for (const NegotiationEvent& e : item.negotiation) {
        const int pid = Row(e.name, out);
        const int64_t ts = Micros(e.time);
        switch (e.kind) {
          case NegotiationEvent::Kind::kStart:
            Append(out,
                   absl::StrCat(R"({"ph": "B", "name": "NEGOTIATE_)",
                                absl::AsciiStrToUpper(RequestTypeName(e.type)), R"(", "ts": )", ts,
                                R"(, "pid": )", pid, R"(, "tid": )", kNegotiationThread, "}"));
            break;
          case NegotiationEvent::Kind::kRankReady:
            Append(out, absl::StrCat(R"({"ph": "X", "name": ")", e.rank, R"(", "ts": )", ts,
                                     R"(, "dur": 0, "pid": )", pid, R"(, "tid": )",
                                     kNegotiationThread, "}"));
            break;
          case NegotiationEvent::Kind::kEnd:
            Append(out, absl::StrCat(R"({"ph": "E", "ts": )", ts, R"(, "pid": )", pid,
                                     R"(, "tid": )", kNegotiationThread, "}"));
            break;
          case NegotiationEvent::Kind::kStepEnd:
            // An instant on the steps' row: who was last to the step, and by how much.
            Append(out,
                   absl::StrCat(R"({"ph": "i", "s": "p", "name": "STEP )", e.step, " LAST: RANK ",
                                e.rank, R"(", "ts": )", ts, R"(, "pid": )", pid, R"(, "tid": )",
                                kNegotiationThread, R"(, "args": {"step": )", e.step,
                                R"(, "last_rank": )", e.rank, R"(, "behind_first_ms": )",
                                absl::ToDoubleMilliseconds(e.lateness), "}}"));
            break;
          case NegotiationEvent::Kind::kNamed:
            // An instant on the who-is-slow row, whenever the rank named (or its verdict) changes.
            Append(
                out,
                absl::StrCat(
                    R"({"ph": "i", "s": "p", "name": )",
                    JsonString(e.rank >= 0 ? absl::StrCat("RANK ", e.rank, " HOLDS THE JOB BACK: ",
                                                          absl::AsciiStrToUpper(e.verdict))
                                           : std::string("NO RANK HOLDS THE JOB BACK")),
                    R"(, "ts": )", ts, R"(, "pid": )", pid, R"(, "tid": )", kNegotiationThread,
                    R"(, "args": {"rank": )", e.rank, R"(, "verdict": )", JsonString(e.verdict),
                    R"(, "detail": )", JsonString(e.detail), "}}"));
            break;
        }
      }
      break;
    case Item::Kind::kExecution: {
      const int tid = 1 + item.rank;
      for (const ExecutionSpan& span : item.execution) {
        for (const std::string& tensor : span.tensors) {
          const bool new_row = !rows_.contains(tensor);
          const int pid = Row(tensor, out);
          if (new_row || !announced_.contains({pid, tid})) {
            announced_.insert({pid, tid});
            Append(out, absl::StrCat(R"({"name": "thread_name", "ph": "M", "pid": )", pid,
                                     R"(, "tid": )", tid, R"(, "args": {"name": "rank )", item.rank,
                                     R"("}})"));
          }
          const std::string where = absl::StrCat(R"(, "pid": )", pid, R"(, "tid": )", tid, "}");
          int64_t at = MicrosFromUnix(span.start_unix_us);
          Append(out, absl::StrCat(R"({"ph": "B", "name": )", JsonString(span.op), R"(, "ts": )",
                                   at, where));
          for (const auto& [activity, end_unix_us] : span.activities) {
            const int64_t end = MicrosFromUnix(end_unix_us);
            Append(out, absl::StrCat(R"({"ph": "B", "name": )", JsonString(activity), R"(, "ts": )",
                                     at, where));
            Append(out, absl::StrCat(R"({"ph": "E", "ts": )", end, where));
            at = end;
          }
          Append(out, absl::StrCat(R"({"ph": "E", "ts": )", at, where));
        }
      }
      break;
    }
    case Item::Kind::kCycle:
      Append(out, absl::StrCat(R"({"ph": "i", "name": "CYCLE_START", "s": "g", "ts": )",
                               Micros(item.time), R"(, "pid": 0, "tid": 0})"));
      break;
  }
}

void Timeline::Run() {
  std::string out;
  // Row 0 names the trace.
  Append(&out,
         absl::StrCat(R"({"name": "process_name", "ph": "M", "pid": 0, "args": {"name": )",
                      JsonString(absl::StrCat(title_, " (ts 0 = ", absl::FormatTime(start_), ")")),
                      "}}"));
  bool failed = false;
  while (true) {
    std::vector<Item> items;
    bool closing;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closing_; };
      // Batches go out every 100 ms, or at once on close.
      mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(100));
      items.swap(queue_);
      closing = closing_;
    }
    for (const Item& item : items) Format(item, &out);
    if (!out.empty() && !failed) {
      const int64_t at = stable_.load();
      if (WriteAllAt(fd_, absl::StrCat(out, kTail), at)) {
        stable_.store(at + static_cast<int64_t>(out.size()));
        any_event_ = true;
      } else {
        // A partial write (a full disk) must not leave the file invalid: cut it back to the last
        // complete event and close the array again.
        spdlog::error("timeline {}: write failed ({}); no more events are recorded", path_,
                      std::strerror(errno));
        if (ftruncate(fd_, at) != 0 || !WriteAllAt(fd_, kTail, at)) {
          spdlog::error("timeline {}: could not restore its end ({})", path_, std::strerror(errno));
        }
        failed = true;
      }
    }
    out.clear();
    if (closing) return;
  }
}

}  // namespace ringmaster
