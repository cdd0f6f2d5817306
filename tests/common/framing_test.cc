#include "common/framing.h"

#include <sys/socket.h>
#include <unistd.h>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "ringmaster/v1/worker.pb.h"

namespace ringmaster {
namespace {

class FramingTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds_), 0); }
  void TearDown() override {
    close(fds_[0]);
    close(fds_[1]);
  }
  int fds_[2] = {-1, -1};
};

TEST_F(FramingTest, AFrameWithinItsBoundsAndDeadlineIsRead) {
  v1::RelayLinkChallenge sent;
  sent.set_nonce("abc");
  ASSERT_TRUE(WriteFrame(fds_[0], sent).ok());
  v1::RelayLinkChallenge got;
  ASSERT_TRUE(ReadFrameBy(fds_[1], &got, 64, absl::Now() + absl::Seconds(5)).ok());
  EXPECT_EQ(got.nonce(), "abc");
}

TEST_F(FramingTest, AFrameThatTricklesInPastTheDeadlineIsGivenUpOn) {
  const char partial[2] = {3, 0};  // half a header
  ASSERT_EQ(write(fds_[0], partial, 2), 2);
  const absl::Time start = absl::Now();
  v1::RelayLinkChallenge got;
  absl::Status s = ReadFrameBy(fds_[1], &got, 64, start + absl::Milliseconds(200));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

TEST_F(FramingTest, AFrameLongerThanItsBoundIsRefusedBeforeItsBodyIsRead) {
  const char header[4] = {0x41, 0, 0, 0};  // 65 bytes announced, none sent
  ASSERT_EQ(write(fds_[0], header, 4), 4);
  v1::RelayLinkChallenge got;
  absl::Status s = ReadFrameBy(fds_[1], &got, 64, absl::Now() + absl::Seconds(5));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_EQ(s.message(), "frame of 65 bytes exceeds 64");
}

}  // namespace
}  // namespace ringmaster
