// The CLI's rank-prefixed output: whole lines only, never two ranks mixed mid-line.
#include "cli/log_printer.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

class LogPrinterTest : public ::testing::Test {
 protected:
  LogPrinter Printer(bool prefix) {
    return LogPrinter(prefix, [this](bool to_stderr, std::string_view text) {
      (to_stderr ? err_ : out_).emplace_back(text);
    });
  }
  std::vector<std::string> out_;  // one entry per sink call
  std::vector<std::string> err_;
};

TEST_F(LogPrinterTest, PrefixesEveryLineWithItsRankAndPrintsAChunksLinesAtOnce) {
  LogPrinter p = Printer(true);
  p.Write(0, false, "hello from 0 of 2\nsecond line\n");
  p.Write(1, false, "hello from 1 of 2\n");
  EXPECT_THAT(out_,
              ElementsAre("[0] hello from 0 of 2\n[0] second line\n", "[1] hello from 1 of 2\n"));
  EXPECT_THAT(err_, IsEmpty());
}

TEST_F(LogPrinterTest, PartialLinesWaitForTheirNewlineSoRanksNeverMixMidLine) {
  LogPrinter p = Printer(true);
  p.Write(0, false, "epoch 1: lo");
  p.Write(1, false, "epoch 1: loss 0.");
  p.Write(0, false, "ss 0.5\nepoch 2");
  p.Write(1, false, "6\n");
  EXPECT_THAT(out_, ElementsAre("[0] epoch 1: loss 0.5\n", "[1] epoch 1: loss 0.6\n"));
  // The end of the output prints what is left, as whole lines.
  p.Flush();
  EXPECT_THAT(out_,
              ElementsAre("[0] epoch 1: loss 0.5\n", "[1] epoch 1: loss 0.6\n", "[0] epoch 2\n"));
  p.Flush();
  EXPECT_EQ(out_.size(), 3u);
}

TEST_F(LogPrinterTest, StderrGoesToStderrWithItsOwnPartialLine) {
  LogPrinter p = Printer(true);
  p.Write(2, true, "Traceback (most recent");
  p.Write(2, false, "step 7\n");
  p.Write(2, true, " call last):\n");
  EXPECT_THAT(out_, ElementsAre("[2] step 7\n"));
  EXPECT_THAT(err_, ElementsAre("[2] Traceback (most recent call last):\n"));
}

TEST_F(LogPrinterTest, EmptyLinesKeepTheirPrefix) {
  LogPrinter p = Printer(true);
  p.Write(0, false, "\n\nx\n");
  EXPECT_THAT(out_, ElementsAre("[0] \n[0] \n[0] x\n"));
}

TEST_F(LogPrinterTest, AnOverlongPartialLineIsPrintedRatherThanBufferedForever) {
  LogPrinter p = Printer(true);
  const std::string progress(LogPrinter::kMaxPartialLine + 1, '#');
  p.Write(0, false, progress);
  EXPECT_THAT(out_, ElementsAre("[0] " + progress + "\n"));
}

TEST_F(LogPrinterTest, WithoutPrefixesOutputPassesThroughAsItComes) {
  LogPrinter p = Printer(false);
  p.Write(3, false, "50%\r");
  p.Write(3, true, "warn");
  p.Write(3, false, "100%\n");
  p.Flush();
  EXPECT_THAT(out_, ElementsAre("50%\r", "100%\n"));
  EXPECT_THAT(err_, ElementsAre("warn"));
}

}  // namespace
}  // namespace ringmaster::cli
