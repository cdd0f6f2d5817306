// The worker's side of the reliable session: batches numbered and kept until acknowledged, held
// while the session resumes and re-sent in order after it; response lists applied in order, once
// each, a list that overtook re-sent ones held until the gap is filled.
#include "worker/negotiation/session_ledger.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

v1::WorkerMessage Batch(const std::string& name) {
  v1::WorkerMessage m;
  m.mutable_requests()->set_job_id("job-000001");
  m.mutable_requests()->add_requests()->set_name(name);
  return m;
}

v1::ResponseList List(uint64_t seq) {
  v1::ResponseList l;
  l.set_seq(seq);
  return l;
}

std::vector<uint64_t> Seqs(const std::vector<v1::ResponseList>& lists) {
  std::vector<uint64_t> out;
  for (const v1::ResponseList& l : lists) out.push_back(l.seq());
  return out;
}

TEST(SessionLedgerTest, BatchesAreNumberedAndCarryWhatTheRankReceived) {
  SessionLedger ledger(/*rank=*/1);
  v1::WorkerMessage a = Batch("a");
  EXPECT_TRUE(ledger.Prepare(a));
  EXPECT_EQ(a.requests().seq(), 1u);
  EXPECT_EQ(a.requests().ack_responses(), 0u);
  EXPECT_THAT(Seqs(ledger.Accept(List(1))), ElementsAre(1));
  v1::WorkerMessage b = Batch("b");
  EXPECT_TRUE(ledger.Prepare(b));
  EXPECT_EQ(b.requests().seq(), 2u);
  EXPECT_EQ(b.requests().ack_responses(), 1u);
  EXPECT_EQ(ledger.kept(), 2u);
  // The coordinator acknowledges rank 1's batch 1 (rank 0's figure is someone else's).
  v1::ResponseList acks = List(2);
  acks.add_request_acks(7);
  acks.add_request_acks(1);
  ledger.Accept(acks);
  EXPECT_EQ(ledger.kept(), 1u);
}

TEST(SessionLedgerTest, AfterALostSessionNewBatchesWaitAndEverythingUnacknowledgedGoesAgain) {
  SessionLedger ledger(0);
  v1::WorkerMessage m1 = Batch("a"), m2 = Batch("b"), m3 = Batch("c");
  ASSERT_TRUE(ledger.Prepare(m1));
  ASSERT_TRUE(ledger.Prepare(m2));  // "sent", but lost with the session
  ledger.Lost();
  EXPECT_FALSE(ledger.Prepare(m3));  // kept, not sent: it must follow the re-sent ones
  v1::RankResume resume;
  ledger.FillResume(&resume);
  EXPECT_EQ(resume.rank(), 0);
  EXPECT_EQ(resume.last_response_seq(), 0u);
  std::vector<v1::WorkerMessage> again = ledger.Resumed(/*last_request_seq=*/1);
  ASSERT_EQ(again.size(), 2u);
  EXPECT_EQ(again[0].requests().seq(), 2u);
  EXPECT_EQ(again[0].requests().requests(0).name(), "b");
  EXPECT_EQ(again[1].requests().seq(), 3u);
  v1::WorkerMessage m4 = Batch("d");
  EXPECT_TRUE(ledger.Prepare(m4));  // resumed: sent at once again
  EXPECT_EQ(m4.requests().seq(), 4u);
}

TEST(SessionLedgerTest, ListsAreAppliedInOrderOnceEach) {
  SessionLedger ledger(0);
  EXPECT_THAT(Seqs(ledger.Accept(List(1))), ElementsAre(1));
  EXPECT_THAT(Seqs(ledger.Accept(List(1))), IsEmpty());  // re-sent: a duplicate
  // A new list overtook the re-sent ones: held until 2 and 3 have come.
  EXPECT_THAT(Seqs(ledger.Accept(List(4))), IsEmpty());
  EXPECT_THAT(Seqs(ledger.Accept(List(2))), ElementsAre(2));
  EXPECT_THAT(Seqs(ledger.Accept(List(3))), ElementsAre(3, 4));
  EXPECT_EQ(ledger.last_response_seq(), 4u);
  v1::ResponseList unnumbered;  // from a coordinator that does not number them: as they come
  EXPECT_THAT(Seqs(ledger.Accept(unnumbered)), ElementsAre(0));
}

TEST(SessionLedgerTest, ListsAppliedAreRetainedUntilEveryRankHasThemAndGoInTheResume) {
  SessionLedger ledger(/*rank=*/1);
  v1::WorkerMessage a = Batch("a"), b = Batch("b");
  ASSERT_TRUE(ledger.Prepare(a));
  ASSERT_TRUE(ledger.Prepare(b));
  v1::ResponseList one = List(1);
  one.add_resend_ids(5);  // this rank's own part: not what the others would be given
  ledger.Accept(one);
  ledger.Accept(List(2));
  ledger.Accept(List(3));
  EXPECT_EQ(ledger.retained(), 3u);
  // Every rank has list 2 (said with the acknowledgements): only list 3 is kept.
  v1::ResponseList four = List(4);
  four.set_all_have(2);
  ledger.Accept(four);
  v1::RankResume resume;
  ledger.FillResume(&resume);
  EXPECT_EQ(resume.rank(), 1);
  EXPECT_EQ(resume.last_response_seq(), 4u);
  EXPECT_EQ(resume.last_request_seq(), 2u);  // the last batch numbered
  std::vector<uint64_t> kept;
  for (const v1::ResponseList& l : resume.retained()) kept.push_back(l.seq());
  EXPECT_THAT(kept, ElementsAre(3, 4));
  // Retained lists carry nothing of this rank alone.
  ledger.Accept(List(5));
  v1::ResponseList six = List(6);
  six.add_resend_ids(9);
  ledger.Accept(six);
  v1::RankResume again;
  ledger.FillResume(&again);
  ASSERT_EQ(again.retained_size(), 4);
  EXPECT_EQ(again.retained(3).seq(), 6u);
  EXPECT_EQ(again.retained(3).resend_ids_size(), 0);
}

TEST(SessionLedgerTest, RetainedListsAreBoundedOldestFirst) {
  SessionLedger ledger(0);
  for (uint64_t seq = 1; seq <= SessionLedger::kMaxRetained + 10; ++seq) ledger.Accept(List(seq));
  EXPECT_EQ(ledger.retained(), SessionLedger::kMaxRetained);
  v1::RankResume resume;
  ledger.FillResume(&resume);
  EXPECT_EQ(resume.retained(0).seq(), 11u);
}

TEST(SessionLedgerTest, ALostSessionDropsListsHeldOutOfOrder) {
  SessionLedger ledger(0);
  ledger.Accept(List(1));
  EXPECT_THAT(Seqs(ledger.Accept(List(3))), IsEmpty());  // held: 2 has not come
  ledger.Lost();
  // The coordinator re-sends everything after 1; a restarted one numbers its own lists from the
  // last one any rank applied, so a list held from before must not be applied in their place.
  EXPECT_THAT(Seqs(ledger.Accept(List(2))), ElementsAre(2));
  EXPECT_THAT(Seqs(ledger.Accept(List(3))), ElementsAre(3));
}

}  // namespace
}  // namespace ringmaster
