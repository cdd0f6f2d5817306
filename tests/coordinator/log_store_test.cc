// The log store: bounds, cursors, rank filters and followers, with a FakeClock: no threads, no
// sleeps.
#include "coordinator/log_store.h"

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr int64_t kAll = LogStore::kAllRanks;
constexpr int64_t kBig = int64_t{1} << 30;

// "rank:data" of each chunk, for readable expectations.
std::vector<std::string> Texts(const LogRead& read) {
  std::vector<std::string> out;
  for (const LogChunk& c : read.chunks) out.push_back(std::to_string(c.rank) + ":" + c.data);
  return out;
}

class LogStoreTest : public ::testing::Test {
 protected:
  LogStore Store(int64_t per_rank = int64_t{4} << 20, int64_t total = kBig) {
    return LogStore(LogStoreOptions{
        .clock = &clock_, .max_bytes_per_rank = per_rank, .max_total_bytes = total, .journal = {}});
  }
  FakeClock clock_;
};

TEST_F(LogStoreTest, ARemovedJobsLogReadsAsEndedAndIsNotMadeAgain) {
  LogStore store = Store();
  ASSERT_TRUE(store.Append("job-1", 0, OutputStream::kStdout, "hello\n").ok());
  store.End("job-1");
  const int64_t before = store.total_bytes();
  EXPECT_GT(before, 0);
  int woken = 0;
  store.Subscribe("job-1", [&woken] { ++woken; });
  store.Remove("job-1");
  EXPECT_EQ(woken, 1);  // its follower was told
  EXPECT_EQ(store.total_bytes(), 0);
  LogRead read = store.Read("job-1", kAll, 0, kBig);
  EXPECT_TRUE(read.chunks.empty());
  EXPECT_TRUE(read.end);                            // a follower is done, not waiting for ever
  store.Subscribe("job-1", [&woken] { ++woken; });  // a late follower makes no log
  EXPECT_TRUE(store.Read("job-1", kAll, 0, kBig).end);
  // A job never seen is not ended: its output may still come.
  EXPECT_FALSE(store.Read("job-2", kAll, 0, kBig).end);
}

TEST_F(LogStoreTest, ReadsEveryRanksChunksInArrivalOrderWithStreamAndTime) {
  LogStore store = Store();
  ASSERT_TRUE(store.Append("j", 1, OutputStream::kStdout, "b1\n").ok());
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(store.Append("j", 0, OutputStream::kStderr, "a1\n").ok());
  ASSERT_TRUE(store.Append("j", 1, OutputStream::kStdout, "b2\n").ok());
  ASSERT_TRUE(store.Append("other", 0, OutputStream::kStdout, "x\n").ok());

  LogRead all = store.Read("j", kAll, 0, kBig);
  EXPECT_THAT(Texts(all), ElementsAre("1:b1\n", "0:a1\n", "1:b2\n"));
  EXPECT_EQ(all.chunks[0].seq, 1);
  EXPECT_EQ(all.chunks[2].seq, 3);
  EXPECT_EQ(all.cursor, 3);
  EXPECT_FALSE(all.end);
  EXPECT_EQ(all.chunks[1].stream, OutputStream::kStderr);
  EXPECT_EQ(all.chunks[0].time, absl::FromUnixSeconds(1'700'000'000));
  EXPECT_EQ(all.chunks[1].time, absl::FromUnixSeconds(1'700'000'001));

  EXPECT_THAT(Texts(store.Read("j", 1, 0, kBig)), ElementsAre("1:b1\n", "1:b2\n"));
  EXPECT_THAT(Texts(store.Read("j", 5, 0, kBig)), IsEmpty());
  EXPECT_THAT(Texts(store.Read("unknown", kAll, 0, kBig)), IsEmpty());
  EXPECT_EQ(store.Head("j"), 3);
  EXPECT_EQ(store.Head("unknown"), 0);
}

TEST_F(LogStoreTest, LastLinesAreARanksNewestNonBlankLinesAcrossChunksAndStreams) {
  LogStore store = Store();
  EXPECT_TRUE(store.LastLines("j", 0, 5, 240).empty());
  ASSERT_TRUE(store.Append("j", 0, OutputStream::kStdout, "one\ntw").ok());
  ASSERT_TRUE(store.Append("j", 1, OutputStream::kStdout, "other rank\n").ok());
  ASSERT_TRUE(store.Append("j", 0, OutputStream::kStderr, "o\n\n  \nthree\n").ok());
  ASSERT_TRUE(store.Append("j", 0, OutputStream::kStdout, std::string(300, 'x') + "\nfour").ok());
  EXPECT_THAT(store.LastLines("j", 0, 5, 240),
              ElementsAre("one", "two", "three", std::string(240, 'x'), "four"));
  EXPECT_THAT(store.LastLines("j", 0, 2, 240), ElementsAre(std::string(240, 'x'), "four"));
  EXPECT_THAT(store.LastLines("j", 1, 5, 240), ElementsAre("other rank"));
  EXPECT_TRUE(store.LastLines("j", 2, 5, 240).empty());
}

TEST_F(LogStoreTest, LastLinesAreValidUtf8CutOnACharacterAndSplitAtCarriageReturns) {
  LogStore store = Store();
  // "██" is 6 bytes; cut at 4, the second character goes whole. \xff is no UTF-8 at all.
  ASSERT_TRUE(store.Append("j", 0, OutputStream::kStdout, "\xe2\x96\x88\xe2\x96\x88\n").ok());
  ASSERT_TRUE(store
                  .Append("j", 0, OutputStream::kStdout,
                          "a\xff"
                          "b\n10%\r50%\r100%\n")
                  .ok());
  EXPECT_THAT(store.LastLines("j", 0, 5, 4),
              ElementsAre("\xe2\x96\x88", "a?b", "10%", "50%", "100%"));
}

TEST_F(LogStoreTest, ACursorResumesAfterTheLastChunkRead) {
  LogStore store = Store();
  for (const char* s : {"one", "two", "three"}) {
    ASSERT_TRUE(store.Append("j", 0, OutputStream::kStdout, s).ok());
  }
  // Batches stop before exceeding max_bytes, but always hold at least one chunk.
  LogRead first = store.Read("j", kAll, 0, 6);
  EXPECT_THAT(Texts(first), ElementsAre("0:one", "0:two"));
  LogRead second = store.Read("j", kAll, first.cursor, 1);
  EXPECT_THAT(Texts(second), ElementsAre("0:three"));
  EXPECT_EQ(second.cursor, 3);
  LogRead none = store.Read("j", kAll, second.cursor, kBig);
  EXPECT_THAT(Texts(none), IsEmpty());
  EXPECT_EQ(none.cursor, 3);  // unchanged
  // `until` stops at a seq: what a non-following reader saw when it started.
  EXPECT_THAT(Texts(store.Read("j", kAll, 0, kBig, 2)), ElementsAre("0:one", "0:two"));
}

TEST_F(LogStoreTest, EachRankKeepsOnlyItsLastBytesDroppingOldestChunks) {
  // Room for two 36-byte chunks (36 + 64 overhead each) per rank.
  LogStore store = Store(200);
  const std::string a(36, 'a'), b(36, 'b'), c(36, 'c');
  ASSERT_TRUE(store.Append("j", 0, OutputStream::kStdout, a).ok());
  ASSERT_TRUE(store.Append("j", 1, OutputStream::kStdout, "r1").ok());
  ASSERT_TRUE(store.Append("j", 0, OutputStream::kStdout, b).ok());
  ASSERT_TRUE(store.Append("j", 0, OutputStream::kStdout, c).ok());
  LogRead read = store.Read("j", kAll, 0, kBig);
  EXPECT_THAT(Texts(read), ElementsAre("1:r1", "0:" + b, "0:" + c));  // rank 1 keeps its chunk
  EXPECT_EQ(read.chunks[0].seq, 2);
  EXPECT_EQ(store.total_bytes(), 2 + 64 + 2 * (36 + 64));
  // A reader whose cursor pointed into the dropped output skips it.
  EXPECT_THAT(Texts(store.Read("j", 0, 1, kBig)), ElementsAre("0:" + b, "0:" + c));

  // A chunk larger than the whole bound keeps its tail.
  ASSERT_TRUE(store.Append("j", 2, OutputStream::kStdout, std::string(200, 'x') + "TAIL").ok());
  LogRead big = store.Read("j", 2, 0, kBig);
  ASSERT_EQ(big.chunks.size(), 1u);
  EXPECT_EQ(big.chunks[0].data, std::string(200 - 64 - 4, 'x') + "TAIL");
}

TEST_F(LogStoreTest, LogsOfEndedJobsAreDroppedOldestFirstBeyondTheTotalBound) {
  LogStore store = Store(int64_t{4} << 20, 3 * (100 + 64));
  const std::string data(100, 'd');
  ASSERT_TRUE(store.Append("old", 0, OutputStream::kStdout, data).ok());
  ASSERT_TRUE(store.Append("older-running", 0, OutputStream::kStdout, data).ok());
  ASSERT_TRUE(store.Append("new", 0, OutputStream::kStdout, data).ok());
  store.End("old");
  store.End("new");
  EXPECT_EQ(store.total_bytes(), 3 * (100 + 64));
  // A fourth chunk exceeds the bound: the job that ended first loses its log; running jobs never
  // do.
  ASSERT_TRUE(store.Append("older-running", 0, OutputStream::kStdout, data).ok());
  EXPECT_THAT(Texts(store.Read("old", kAll, 0, kBig)), IsEmpty());
  EXPECT_TRUE(store.Read("old", kAll, 0, kBig).end);  // a follower still sees its end
  EXPECT_EQ(store.Read("new", kAll, 0, kBig).chunks.size(), 1u);
  EXPECT_EQ(store.Read("older-running", kAll, 0, kBig).chunks.size(), 2u);
  EXPECT_EQ(store.total_bytes(), 3 * (100 + 64));
}

TEST_F(LogStoreTest, FollowersAreWokenByOutputAndTheEndWhichComesAfterEverythingIsRead) {
  LogStore store = Store();
  int wakes = 0;
  const int64_t id = store.Subscribe("j", [&] { ++wakes; });
  ASSERT_TRUE(store.Append("j", 0, OutputStream::kStdout, "x").ok());
  ASSERT_TRUE(store.Append("other", 0, OutputStream::kStdout, "y").ok());
  EXPECT_EQ(wakes, 1);

  LogRead read = store.Read("j", kAll, 0, kBig);
  EXPECT_FALSE(read.end);  // the job has not ended
  ASSERT_TRUE(store.Append("j", 1, OutputStream::kStderr, "z").ok());
  store.End("j");
  EXPECT_EQ(wakes, 3);
  store.End("j");  // idempotent: no new wake
  EXPECT_EQ(wakes, 3);

  // The end is reported only once nothing is left after the cursor.
  LogRead rest = store.Read("j", kAll, 0, 1);
  EXPECT_THAT(Texts(rest), ElementsAre("0:x"));
  EXPECT_FALSE(rest.end);
  rest = store.Read("j", kAll, rest.cursor, kBig);
  EXPECT_THAT(Texts(rest), ElementsAre("1:z"));
  EXPECT_TRUE(rest.end);
  // A follower of one rank is done once that rank's output is read.
  EXPECT_TRUE(store.Read("j", 0, 1, kBig).end);

  // No output is accepted after the end.
  absl::Status late = store.Append("j", 0, OutputStream::kStdout, "late");
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(late.message(), "job j has ended; output of rank 0 is not accepted");
  EXPECT_EQ(store.Head("j"), 2);

  store.Unsubscribe("j", id);
  ASSERT_TRUE(store.Append("k", 0, OutputStream::kStdout, "x").ok());
  EXPECT_EQ(wakes, 3);
}

TEST_F(LogStoreTest, ALingeringLogTakesLastWordsUntilItsTimeComes) {
  LogStore store = Store();
  int wakes = 0;
  store.Subscribe("j", [&] { ++wakes; });
  store.End("j", absl::Seconds(2));
  clock_.Advance(absl::Seconds(1));
  store.EndDue();
  ASSERT_TRUE(store.Append("j", 1, OutputStream::kStderr, "Traceback").ok());
  EXPECT_EQ(wakes, 1);  // the output; the log has not ended
  EXPECT_FALSE(store.Read("j", kAll, 0, kBig).end);
  store.End("j", absl::Seconds(5));  // a longer linger does not postpone the end
  clock_.Advance(absl::Seconds(1));
  store.EndDue();
  EXPECT_EQ(wakes, 2);
  LogRead read = store.Read("j", kAll, 0, kBig);
  EXPECT_THAT(Texts(read), ElementsAre("1:Traceback"));
  EXPECT_TRUE(read.end);
  EXPECT_EQ(store.Append("j", 1, OutputStream::kStderr, "late").code(),
            absl::StatusCode::kFailedPrecondition);

  // Ending at once cuts a linger short.
  store.End("k", absl::Seconds(2));
  store.End("k");
  EXPECT_TRUE(store.Read("k", kAll, 0, kBig).end);
}

TEST_F(LogStoreTest, AJobThatEndsWithoutOutputReadsEmptyAndEnded) {
  LogStore store = Store();
  LogRead before = store.Read("j", kAll, 0, kBig);
  EXPECT_FALSE(before.end);
  store.End("j");
  LogRead after = store.Read("j", kAll, 0, kBig);
  EXPECT_THAT(Texts(after), IsEmpty());
  EXPECT_TRUE(after.end);
  EXPECT_TRUE(store.Append("j", 0, OutputStream::kStdout, "").ok());  // empty output: nothing to do
}

TEST_F(LogStoreTest, ASubscriberMayReadFromItsCallback) {
  LogStore store = Store();
  std::vector<std::string> seen;
  int64_t cursor = 0;
  bool ended = false;
  store.Subscribe("j", [&] {
    LogRead r = store.Read("j", kAll, cursor, kBig);
    cursor = r.cursor;
    for (const LogChunk& c : r.chunks) seen.push_back(c.data);
    ended = r.end;
  });
  ASSERT_TRUE(store.Append("j", 0, OutputStream::kStdout, "a").ok());
  ASSERT_TRUE(store.Append("j", 1, OutputStream::kStdout, "b").ok());
  store.End("j");
  EXPECT_THAT(seen, ElementsAre("a", "b"));
  EXPECT_TRUE(ended);
}

TEST(LogStoreReliableTest, AChunkReSentAfterAReconnectIsStoredOnce) {
  FakeClock clock;
  LogStore store(LogStoreOptions{.clock = &clock, .journal = {}});
  ASSERT_TRUE(store.Append("job-000001", 0, OutputStream::kStdout, "one\n", 1).ok());
  ASSERT_TRUE(store.Append("job-000001", 0, OutputStream::kStdout, "two\n", 2).ok());
  // The worker's session broke: it sends its last output again, then goes on.
  ASSERT_TRUE(store.Append("job-000001", 0, OutputStream::kStdout, "one\n", 1).ok());
  ASSERT_TRUE(store.Append("job-000001", 0, OutputStream::kStdout, "two\n", 2).ok());
  ASSERT_TRUE(store.Append("job-000001", 0, OutputStream::kStdout, "three\n", 3).ok());
  // Another rank numbers its own chunks.
  ASSERT_TRUE(store.Append("job-000001", 1, OutputStream::kStderr, "r1\n", 1).ok());
  std::string text;
  for (const LogChunk& c : store.Read("job-000001", kAll, 0, kBig).chunks) text += c.data;
  EXPECT_EQ(text, "one\ntwo\nthree\nr1\n");
}

// ---- The journal: logs that survive a restart (--state-dir) ----

class LogJournalTest : public ::testing::Test {
 protected:
  ~LogJournalTest() override {
    std::error_code error;
    std::filesystem::remove_all(dir_, error);
  }
  LogStore Store(int64_t per_rank = int64_t{4} << 20, int64_t total = kBig) {
    absl::StatusOr<std::unique_ptr<LogJournal>> journal = LogJournal::Open(dir_);
    EXPECT_TRUE(journal.ok()) << journal.status();
    return LogStore(LogStoreOptions{.clock = &clock_,
                                    .max_bytes_per_rank = per_rank,
                                    .max_total_bytes = total,
                                    .journal = *std::move(journal)});
  }
  const std::string dir_ =
      absl::StrCat(std::filesystem::temp_directory_path().string(), "/log_journal_test_", getpid());
  FakeClock clock_;
};

TEST_F(LogJournalTest, ARestartedStoreHasEveryChunkWithItsStreamTimeAndNumbers) {
  {
    LogStore store = Store();
    ASSERT_TRUE(store.Append("job-1", 0, OutputStream::kStdout, "step 0\n", 1).ok());
    clock_.Advance(absl::Seconds(1));
    ASSERT_TRUE(store.Append("job-1", 1, OutputStream::kStderr, std::string("a\0b\n", 4), 1).ok());
    ASSERT_TRUE(store.Append("job-1", 0, OutputStream::kStdout, "step 1\n", 2).ok());
    ASSERT_TRUE(store.Append("job-2", 0, OutputStream::kStdout, "other\n").ok());
  }  // the coordinator goes away
  LogStore store = Store();
  const LogRead read = store.Read("job-1", kAll, 0, kBig);
  EXPECT_THAT(Texts(read), ElementsAre("0:step 0\n", std::string("1:a\0b\n", 6), "0:step 1\n"));
  ASSERT_EQ(read.chunks.size(), 3u);
  EXPECT_EQ(read.chunks[1].stream, OutputStream::kStderr);
  EXPECT_EQ(read.chunks[1].time - read.chunks[0].time, absl::Seconds(1));
  EXPECT_THAT(Texts(store.Read("job-2", kAll, 0, kBig)), ElementsAre("0:other\n"));
  // A chunk the worker sends again after reconnecting is stored once; the next one goes on.
  ASSERT_TRUE(store.Append("job-1", 0, OutputStream::kStdout, "step 1\n", 2).ok());
  ASSERT_TRUE(store.Append("job-1", 0, OutputStream::kStdout, "step 2\n", 3).ok());
  EXPECT_THAT(Texts(store.Read("job-1", 0, 0, kBig)),
              ElementsAre("0:step 0\n", "0:step 1\n", "0:step 2\n"));
}

TEST_F(LogJournalTest, ARecordCutShortIsDroppedAndWhatComesAfterItIsKept) {
  {
    LogStore store = Store();
    ASSERT_TRUE(store.Append("job-1", 0, OutputStream::kStdout, "whole\n", 1).ok());
  }
  {  // the coordinator died writing the next record
    std::FILE* f = std::fopen((dir_ + "/job-1.log").c_str(), "a");
    ASSERT_NE(f, nullptr);
    std::fputs("R 0 1 2 1700000000000000 100\nonly part of it", f);
    std::fclose(f);
  }
  {
    LogStore store = Store();
    EXPECT_THAT(Texts(store.Read("job-1", kAll, 0, kBig)), ElementsAre("0:whole\n"));
    ASSERT_TRUE(store.Append("job-1", 0, OutputStream::kStdout, "after\n", 2).ok());
  }
  LogStore store = Store();
  EXPECT_THAT(Texts(store.Read("job-1", kAll, 0, kBig)), ElementsAre("0:whole\n", "0:after\n"));
}

TEST_F(LogJournalTest, TheFileKeepsToTheBoundAndGoesWithTheLog) {
  const int64_t per_rank = 1000;
  {
    LogStore store = Store(per_rank, /*total=*/3000);
    for (uint64_t i = 1; i <= 200; ++i) {
      ASSERT_TRUE(
          store.Append("job-1", 0, OutputStream::kStdout, absl::StrCat("line ", i, "\n"), i).ok());
    }
    // Rewritten as it grows: never more than a few times what the rank keeps.
    EXPECT_LT(std::filesystem::file_size(dir_ + "/job-1.log"), 5 * per_rank);
  }
  {
    LogStore store = Store(per_rank, 3000);
    const LogRead read = store.Read("job-1", 0, 0, kBig);
    ASSERT_FALSE(read.chunks.empty());
    EXPECT_EQ(read.chunks.back().data, "line 200\n");  // the newest kept, in order
    // Numbers survive the rewrite: a re-sent chunk is still a duplicate.
    ASSERT_TRUE(store.Append("job-1", 0, OutputStream::kStdout, "line 200\n", 200).ok());
    EXPECT_EQ(store.Read("job-1", 0, 0, kBig).chunks.size(), read.chunks.size());
    // An ended job's log dropped for room takes its file with it.
    store.End("job-1");
    ASSERT_TRUE(store.Append("job-2", 0, OutputStream::kStdout, std::string(900, 'x')).ok());
    ASSERT_TRUE(store.Append("job-3", 0, OutputStream::kStdout, std::string(900, 'y')).ok());
    ASSERT_TRUE(store.Append("job-4", 0, OutputStream::kStdout, std::string(900, 'z')).ok());
    EXPECT_TRUE(store.Read("job-1", 0, 0, kBig).chunks.empty());
    EXPECT_FALSE(std::filesystem::exists(dir_ + "/job-1.log"));
  }
}

}  // namespace
}  // namespace ringmaster
