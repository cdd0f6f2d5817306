#include "coordinator/log_store.h"

#include <algorithm>
#include <queue>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ringmaster {

LogStore::LogStore(LogStoreOptions options)
    : clock_(options.clock),
      max_bytes_per_rank_(std::max<int64_t>(options.max_bytes_per_rank, kChunkOverheadBytes + 1)),
      max_total_bytes_(options.max_total_bytes),
      journal_(std::move(options.journal)) {
  if (journal_ == nullptr) return;
  absl::MutexLock lock(&mu_);
  journal_->Load([this](const std::string& job_id, JournalRecord r) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    StoreLocked(job_id, LogLocked(job_id), r.rank, static_cast<OutputStream>(r.stream),
                std::move(r.data), r.seq, r.time, /*journal=*/false);
  });
}

LogStore::~LogStore() = default;

LogStore::JobLog& LogStore::LogLocked(const std::string& job_id) { return jobs_[job_id]; }

std::vector<std::shared_ptr<LogStore::Subscriber>> LogStore::SubscribersOf(const JobLog& log) {
  std::vector<std::shared_ptr<Subscriber>> out;
  out.reserve(log.subscribers.size());
  for (const auto& [id, s] : log.subscribers) out.push_back(s);
  return out;
}

absl::Status LogStore::Append(const std::string& job_id, int32_t rank, OutputStream stream,
                              std::string data, uint64_t seq) {
  if (data.empty()) return absl::OkStatus();
  std::vector<std::shared_ptr<Subscriber>> notify;
  {
    absl::MutexLock lock(&mu_);
    JobLog& log = LogLocked(job_id);
    if (log.ended) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job_id, " has ended; output of rank ", rank, " is not accepted"));
    }
    // Re-sent after a reconnect: stored already.
    if (!StoreLocked(job_id, log, rank, stream, std::move(data), seq, clock_->Now(), true)) {
      return absl::OkStatus();
    }
    EvictLocked();
    notify = SubscribersOf(log);
  }
  for (const auto& s : notify) (*s)();
  return absl::OkStatus();
}

bool LogStore::StoreLocked(const std::string& job_id, JobLog& log, int32_t rank,
                           OutputStream stream, std::string data, uint64_t seq, absl::Time time,
                           bool journal) {
  // A chunk larger than the whole bound keeps its tail: the last bytes are the ones that matter.
  const int64_t room = max_bytes_per_rank_ - kChunkOverheadBytes;
  if (static_cast<int64_t>(data.size()) > room) data.erase(0, data.size() - room);
  RankLog& r = log.ranks[rank];
  if (seq != 0) {
    if (seq <= r.last_seq) return false;
    r.last_seq = seq;
  }
  if (journal && journal_ != nullptr) {
    const int64_t written =
        journal_->Write(job_id, JournalRecord{rank, static_cast<int>(stream), seq, time, data});
    // The file keeps what the store keeps, give or take: rewritten once it has grown to 4 times
    // the job's bound.
    if (written > 4 * max_bytes_per_rank_ * static_cast<int64_t>(log.ranks.size())) {
      std::vector<std::pair<int64_t, JournalRecord>> kept;  // by arrival
      for (const auto& [n, rank_log] : log.ranks) {
        for (const LogChunk& c : rank_log.chunks) {
          kept.emplace_back(c.seq, JournalRecord{n, static_cast<int>(c.stream), 0, c.time, c.data});
        }
      }
      std::sort(kept.begin(), kept.end(),
                [](const auto& a, const auto& b) { return a.first < b.first; });
      std::vector<JournalRecord> records;
      for (auto& [order, record] : kept) records.push_back(std::move(record));
      records.push_back({rank, static_cast<int>(stream), 0, time, data});
      // Each rank's last number goes on its last record, so re-sent chunks stay dropped.
      absl::flat_hash_set<int32_t> numbered;
      for (auto it = records.rbegin(); it != records.rend(); ++it) {
        if (numbered.insert(it->rank).second) it->seq = log.ranks[it->rank].last_seq;
      }
      journal_->Rewrite(job_id, records);
    }
  }
  const int64_t cost = static_cast<int64_t>(data.size()) + kChunkOverheadBytes;
  r.chunks.push_back(LogChunk{++log.head, rank, stream, std::move(data), time});
  r.bytes += cost;
  total_bytes_ += cost;
  while (r.bytes > max_bytes_per_rank_) {
    const int64_t dropped =
        static_cast<int64_t>(r.chunks.front().data.size()) + kChunkOverheadBytes;
    r.bytes -= dropped;
    total_bytes_ -= dropped;
    r.chunks.pop_front();
  }
  return true;
}

std::vector<std::shared_ptr<LogStore::Subscriber>> LogStore::EndLocked(const std::string& job_id,
                                                                       JobLog& log) {
  if (log.ended) return {};
  log.ended = true;
  lingering_.erase(job_id);
  if (journal_ != nullptr) journal_->Close(job_id);  // no more output: no open file kept for it
  ended_order_.push_back(job_id);
  EvictLocked();
  return SubscribersOf(log);
}

void LogStore::End(const std::string& job_id, absl::Duration linger) {
  std::vector<std::shared_ptr<Subscriber>> notify;
  {
    absl::MutexLock lock(&mu_);
    JobLog& log = LogLocked(job_id);
    if (linger <= absl::ZeroDuration()) {
      notify = EndLocked(job_id, log);
    } else if (!log.ended) {
      log.end_at = std::min(log.end_at, clock_->Now() + linger);
      lingering_.insert(job_id);
    }
  }
  for (const auto& s : notify) (*s)();
}

void LogStore::EndDue() {
  std::vector<std::shared_ptr<Subscriber>> notify;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = clock_->Now();
    std::vector<std::string> due;
    for (const std::string& id : lingering_) {
      if (jobs_[id].end_at <= now) due.push_back(id);
    }
    for (const std::string& id : due) {
      for (auto& s : EndLocked(id, jobs_[id])) notify.push_back(std::move(s));
    }
  }
  for (const auto& s : notify) (*s)();
}

void LogStore::Remove(const std::string& job_id) {
  std::vector<std::shared_ptr<Subscriber>> notify;
  {
    absl::MutexLock lock(&mu_);
    if (removed_.insert(job_id).second) removed_order_.push_back(job_id);
    while (removed_order_.size() > kRemembered) {
      removed_.erase(removed_order_.front());
      removed_order_.pop_front();
    }
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return;
    // Its followers read again, and now read its end.
    notify = it->second.ended ? SubscribersOf(it->second) : EndLocked(job_id, it->second);
    for (auto& [rank, r] : it->second.ranks) total_bytes_ -= r.bytes;
    jobs_.erase(it);
    ended_order_.erase(std::remove(ended_order_.begin(), ended_order_.end(), job_id),
                       ended_order_.end());
    if (journal_ != nullptr) journal_->Remove(job_id);
  }
  for (const auto& s : notify) (*s)();
}

void LogStore::EvictLocked() {
  while (total_bytes_ > max_total_bytes_ && !ended_order_.empty()) {
    auto it = jobs_.find(ended_order_.front());
    ended_order_.pop_front();
    if (it == jobs_.end()) continue;
    // Keep the emptied log (ended, with its head) so readers and followers still see its end.
    for (auto& [rank, r] : it->second.ranks) total_bytes_ -= r.bytes;
    it->second.ranks.clear();
    if (journal_ != nullptr) journal_->Remove(it->first);
  }
}

namespace {

// The length of the valid UTF-8 sequence at text[i] (RFC 3629: no overlong forms, no surrogates,
// nothing above U+10FFFF), or 0.
size_t Utf8Length(absl::string_view text, size_t i) {
  auto at = [&](size_t k) { return static_cast<unsigned char>(text[i + k]); };
  const unsigned char c = at(0);
  if (c < 0x80) return 1;
  const size_t n = c >= 0xc2 && c <= 0xdf   ? 2
                   : c >= 0xe0 && c <= 0xef ? 3
                   : c >= 0xf0 && c <= 0xf4 ? 4
                                            : 0;
  if (n == 0 || i + n > text.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((at(k) >> 6) != 0x2) return 0;
  }
  if ((c == 0xe0 && at(1) < 0xa0) || (c == 0xed && at(1) >= 0xa0) || (c == 0xf0 && at(1) < 0x90) ||
      (c == 0xf4 && at(1) >= 0x90)) {
    return 0;
  }
  return n;
}

// At most `max_bytes` of `text` as valid UTF-8 (the lines go into proto3 strings): cut on a
// character boundary, each byte of an invalid sequence replaced by '?'.
std::string ValidUtf8Prefix(absl::string_view text, size_t max_bytes) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const size_t n = Utf8Length(text, i);
    const bool valid = n > 0;
    const size_t take = valid ? n : 1;
    if (out.size() + take > max_bytes) break;
    if (valid) {
      out.append(text.data() + i, n);
    } else {
      out.push_back('?');
    }
    i += take;
  }
  return out;
}

}  // namespace

std::vector<std::string> LogStore::LastLines(const std::string& job_id, int32_t rank, int max_lines,
                                             size_t max_line_bytes) const {
  // Enough of the end to hold the lines asked for, unless they are very long.
  const size_t keep = static_cast<size_t>(max_lines + 1) * (max_line_bytes + 1);
  std::string text;
  {
    absl::MutexLock lock(&mu_);
    auto job = jobs_.find(job_id);
    if (job == jobs_.end()) return {};
    auto it = job->second.ranks.find(rank);
    if (it == job->second.ranks.end()) return {};
    const std::deque<LogChunk>& chunks = it->second.chunks;
    size_t first = chunks.size();
    for (size_t bytes = 0; first > 0 && bytes < keep;) bytes += chunks[--first].data.size();
    for (size_t i = first; i < chunks.size(); ++i) text += chunks[i].data;
  }
  std::vector<std::string> lines;
  // A progress bar's carriage returns end lines too.
  for (absl::string_view line : absl::StrSplit(text, absl::ByAnyChar("\r\n"))) {
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    lines.push_back(ValidUtf8Prefix(line, max_line_bytes));
  }
  if (lines.size() > static_cast<size_t>(max_lines)) {
    lines.erase(lines.begin(), lines.end() - max_lines);
  }
  return lines;
}

LogRead LogStore::Read(const std::string& job_id, int32_t rank, int64_t after, int64_t max_bytes,
                       int64_t until) const {
  LogRead out;
  out.cursor = after;
  absl::MutexLock lock(&mu_);
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) {
    out.end = removed_.contains(job_id);  // removed: ended long ago
    return out;
  }
  const JobLog& log = job->second;

  // Merge the ranks' chunks by seq: each rank's deque is sorted, so start each at its first chunk
  // after the cursor and repeatedly take the smallest.
  struct Head {
    int64_t seq;
    const std::deque<LogChunk>* chunks;
    size_t index;
    bool operator>(const Head& o) const { return seq > o.seq; }
  };
  std::priority_queue<Head, std::vector<Head>, std::greater<Head>> heads;
  auto add = [&](const RankLog& r) {
    auto it = std::upper_bound(r.chunks.begin(), r.chunks.end(), after,
                               [](int64_t seq, const LogChunk& c) { return seq < c.seq; });
    if (it != r.chunks.end()) {
      heads.push(Head{it->seq, &r.chunks, static_cast<size_t>(it - r.chunks.begin())});
    }
  };
  if (rank == kAllRanks) {
    for (const auto& [r, rank_log] : log.ranks) add(rank_log);
  } else if (auto it = log.ranks.find(rank); it != log.ranks.end()) {
    add(it->second);
  }

  int64_t bytes = 0;
  while (!heads.empty()) {
    Head h = heads.top();
    const LogChunk& c = (*h.chunks)[h.index];
    if (c.seq > until) break;
    if (!out.chunks.empty() && bytes + static_cast<int64_t>(c.data.size()) > max_bytes) break;
    heads.pop();
    bytes += static_cast<int64_t>(c.data.size());
    out.chunks.push_back(c);
    out.cursor = c.seq;
    if (++h.index < h.chunks->size()) {
      h.seq = (*h.chunks)[h.index].seq;
      heads.push(h);
    }
  }
  out.end = log.ended && heads.empty();
  return out;
}

int64_t LogStore::Head(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? 0 : it->second.head;
}

int64_t LogStore::Subscribe(const std::string& job_id, Subscriber subscriber) {
  absl::MutexLock lock(&mu_);
  const int64_t id = next_subscriber_++;
  // A removed job's log is not made again (nothing would end it): its follower reads the end.
  if (removed_.contains(job_id)) return id;
  LogLocked(job_id).subscribers[id] = std::make_shared<Subscriber>(std::move(subscriber));
  return id;
}

void LogStore::Unsubscribe(const std::string& job_id, int64_t id) {
  absl::MutexLock lock(&mu_);
  if (auto it = jobs_.find(job_id); it != jobs_.end()) it->second.subscribers.erase(id);
}

int64_t LogStore::total_bytes() const {
  absl::MutexLock lock(&mu_);
  return total_bytes_;
}

}  // namespace ringmaster
