// The job-code archive: what a client packs unpacks the same on a worker; what could write outside
// the rank's directory, or fill its disk, is refused with the member named.
#include "common/source_archive.h"

#include <archive.h>
#include <archive_entry.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace ringmaster {
namespace {

namespace fs = std::filesystem;

class SourceArchiveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("source_archive_test-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static void Write(const fs::path& path, const std::string& text) {
    fs::create_directories(path.parent_path());
    std::ofstream(path, std::ios::binary) << text;
  }
  static std::string Read(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  struct Member {
    std::string path;
    mode_t type = AE_IFREG;
    std::string data;      // a regular file's
    std::string link;      // a symbolic link's target
    std::string hardlink;  // a hard link's target
  };
  // A tar.gz archive holding exactly `members`, as a hostile client could make one.
  fs::path Craft(const std::vector<Member>& members) {
    const fs::path path = dir_ / "crafted.tar.gz";
    archive* a = archive_write_new();
    archive_write_add_filter_gzip(a);
    archive_write_set_format_pax_restricted(a);
    EXPECT_EQ(archive_write_open_filename(a, path.c_str()), ARCHIVE_OK);
    for (const Member& m : members) {
      archive_entry* e = archive_entry_new();
      archive_entry_set_pathname(e, m.path.c_str());
      archive_entry_set_filetype(e, m.type);
      archive_entry_set_perm(e, 0644);
      if (!m.link.empty()) archive_entry_set_symlink(e, m.link.c_str());
      if (!m.hardlink.empty()) archive_entry_set_hardlink(e, m.hardlink.c_str());
      archive_entry_set_size(e, static_cast<la_int64_t>(m.data.size()));
      EXPECT_EQ(archive_write_header(a, e), ARCHIVE_OK);
      if (!m.data.empty()) archive_write_data(a, m.data.data(), m.data.size());
      archive_entry_free(e);
    }
    archive_write_close(a);
    archive_write_free(a);
    return path;
  }
  absl::Status Pack(const fs::path& source, const fs::path& archive, int64_t max_bytes) {
    absl::StatusOr<std::string> packed = PackDirectory(source.string(), max_bytes);
    if (!packed.ok()) return packed.status();
    std::ofstream(archive, std::ios::binary) << *packed;
    return absl::OkStatus();
  }

  fs::path dir_;
};

TEST_F(SourceArchiveTest, WhatIsPackedUnpacksTheSameWithLinksAndModes) {
  const fs::path src = dir_ / "src";
  Write(src / "train.py", "print('hi')\n");
  Write(src / "pkg" / "model.py", "class Net: pass\n");
  Write(src / "run.sh", "#!/bin/sh\necho run\n");
  fs::permissions(src / "run.sh", fs::perms::owner_exec, fs::perm_options::add);
  fs::create_directory_symlink("pkg", src / "alias");
  fs::create_directories(src / "empty");
  ASSERT_TRUE(Pack(src, dir_ / "a.tar.gz", int64_t{1} << 20).ok());

  absl::StatusOr<ArchiveSummary> summary = InspectArchive((dir_ / "a.tar.gz").string());
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->files, 3);
  EXPECT_EQ(summary->unpacked_bytes, 12 + 16 + 19);

  const fs::path out = dir_ / "out";
  ASSERT_TRUE(ExtractArchive((dir_ / "a.tar.gz").string(), out.string()).ok());
  EXPECT_EQ(Read(out / "train.py"), "print('hi')\n");
  EXPECT_EQ(Read(out / "pkg" / "model.py"), "class Net: pass\n");
  EXPECT_EQ(Read(out / "alias" / "model.py"), "class Net: pass\n");
  EXPECT_EQ(fs::read_symlink(out / "alias"), "pkg");
  EXPECT_TRUE(fs::is_directory(out / "empty"));
  EXPECT_NE(fs::status(out / "run.sh").permissions() & fs::perms::owner_exec, fs::perms::none);
  EXPECT_EQ(fs::status(out / "train.py").permissions() & fs::perms::owner_exec, fs::perms::none);
}

TEST_F(SourceArchiveTest, PackingPastTheLimitNamesIt) {
  const fs::path src = dir_ / "src";
  std::string noise(300'000, '\0');
  std::mt19937 random(7);
  for (char& c : noise) c = static_cast<char>(random());
  Write(src / "data.bin", noise);
  absl::StatusOr<std::string> packed = PackDirectory(src.string(), 100'000);
  ASSERT_FALSE(packed.ok());
  EXPECT_EQ(packed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(packed.status().message(),
            "source directory " + src.string() +
                " packs to more than the limit of 100000 bytes (a tar.gz archive)");
  EXPECT_EQ(PackDirectory((dir_ / "missing").string(), 100).status().message(),
            "source directory " + (dir_ / "missing").string() + " is not a directory");
}

TEST_F(SourceArchiveTest, MembersThatWouldLeaveTheDirectoryAreRefusedAndNothingIsWritten) {
  struct Case {
    std::vector<Member> members;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{{.path = "ok.txt", .data = "x"}, {.path = "../evil.txt", .data = "x"}},
       "source archive member '../evil.txt' has a '.' or '..' component"},
      {{{.path = "/etc/evil.txt", .data = "x"}},
       "source archive member '/etc/evil.txt' is not a relative path"},
      {{{.path = "a/../../evil.txt", .data = "x"}},
       "source archive member 'a/../../evil.txt' has a '.' or '..' component"},
      {{{.path = "up", .type = AE_IFLNK, .link = "../../.."}},
       "source archive member 'up' is a symbolic link to '../../..', outside the archive"},
      {{{.path = "passwd", .type = AE_IFLNK, .link = "/etc/passwd"}},
       "source archive member 'passwd' is a symbolic link to '/etc/passwd', outside the archive"},
      {{{.path = "hard", .type = AE_IFREG, .hardlink = "../outside"}},
       "source archive member 'hard' (a hard link) target '../outside' has a '.' or '..' "
       "component"},
      {{{.path = "fifo", .type = AE_IFIFO}},
       "source archive member 'fifo' is not a regular file, a directory or a symbolic link"},
      {{{.path = "dev", .type = AE_IFCHR}},
       "source archive member 'dev' is not a regular file, a directory or a symbolic link"},
      // A link to a directory inside, then a member under the link: the worker would refuse to
      // unpack through the link, so submission refuses it (the two checks agree).
      {{{.path = "real", .type = AE_IFDIR},
        {.path = "alias", .type = AE_IFLNK, .link = "real"},
        {.path = "alias/evil.txt", .data = "x"}},
       "source archive member 'alias/evil.txt' lies under 'alias', a symbolic link in the "
       "archive: it would be unpacked through the link (pack the directory the link points to "
       "instead, or the link alone)"},
  };
  for (const Case& c : cases) {
    const fs::path archive = Craft(c.members);
    absl::StatusOr<ArchiveSummary> summary = InspectArchive(archive.string());
    ASSERT_FALSE(summary.ok()) << c.message;
    EXPECT_EQ(summary.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(summary.status().message(), c.message);
    const fs::path out = dir_ / "out" / "code";
    absl::Status s = ExtractArchive(archive.string(), out.string());
    EXPECT_EQ(s.message(), c.message);
    EXPECT_FALSE(fs::exists(out)) << "extraction began despite: " << c.message;
    EXPECT_FALSE(fs::exists(dir_ / "out" / "evil.txt"));
  }
}

TEST_F(SourceArchiveTest, ALinkToADirectoryInsideIsKeptAndUnpacks) {
  const fs::path archive = Craft({{.path = "real", .type = AE_IFDIR},
                                  {.path = "real/a.py", .data = "A"},
                                  {.path = "alias", .type = AE_IFLNK, .link = "real"}});
  ASSERT_TRUE(InspectArchive(archive.string()).ok());
  ASSERT_TRUE(ExtractArchive(archive.string(), (dir_ / "out").string()).ok());
  EXPECT_EQ(Read(dir_ / "out" / "alias" / "a.py"), "A");
}

TEST_F(SourceArchiveTest, ALinkThatStaysInsideIsKept) {
  const fs::path archive = Craft({{.path = "pkg/a.py", .data = "A"},
                                  {.path = "pkg/b.py", .type = AE_IFLNK, .link = "../pkg/a.py"},
                                  {.path = "c.py", .type = AE_IFREG, .hardlink = "pkg/a.py"}});
  ASSERT_TRUE(InspectArchive(archive.string()).ok());
  ASSERT_TRUE(ExtractArchive(archive.string(), (dir_ / "out").string()).ok());
  EXPECT_EQ(Read(dir_ / "out" / "pkg" / "b.py"), "A");
  EXPECT_EQ(Read(dir_ / "out" / "c.py"), "A");
}

TEST_F(SourceArchiveTest, WhatIsNotATarGzArchiveIsRefused) {
  Write(dir_ / "junk.tar.gz", "this is not gzip data at all");
  absl::StatusOr<ArchiveSummary> summary = InspectArchive((dir_ / "junk.tar.gz").string());
  ASSERT_FALSE(summary.ok());
  EXPECT_EQ(summary.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(summary.status().message(), "the source archive is not a"))
      << summary.status();
  // A valid archive cut short is corrupt, not quietly smaller.
  const fs::path src = dir_ / "src";
  std::string noise(200'000, '\0');
  std::mt19937 random(7);
  for (char& c : noise) c = static_cast<char>(random());
  Write(src / "data.bin", noise);
  ASSERT_TRUE(Pack(src, dir_ / "whole.tar.gz", int64_t{1} << 20).ok());
  const std::string whole = Read(dir_ / "whole.tar.gz");
  Write(dir_ / "cut.tar.gz", whole.substr(0, whole.size() / 2));
  summary = InspectArchive((dir_ / "cut.tar.gz").string());
  ASSERT_FALSE(summary.ok());
  EXPECT_EQ(summary.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ValidateRelativePathTest, AcceptsPlainRelativePathsOnly) {
  EXPECT_TRUE(ValidateRelativePath("p", "model.pt").ok());
  EXPECT_TRUE(ValidateRelativePath("p", "a/b/c..d/.hidden").ok());
  EXPECT_EQ(ValidateRelativePath("p", "").message(), "p '' is empty");
  EXPECT_EQ(ValidateRelativePath("p", "a//b").message(), "p 'a//b' has an empty component");
  EXPECT_EQ(ValidateRelativePath("p", "a/./b").message(), "p 'a/./b' has a '.' or '..' component");
  EXPECT_EQ(ValidateRelativePath("p", "/x").message(), "p '/x' is not a relative path");
  EXPECT_EQ(ValidateRelativePath("p", std::string("a\0b", 3)).message(),
            "p 'a\\000b' contains a NUL byte");
  EXPECT_EQ(ValidateRelativePath("p", std::string(256, 'x')).message(),
            "p '" + std::string(256, 'x') + "' has a component longer than 255 bytes");
}

TEST(Sha256OfFileTest, IsTheDigestOfTheContents) {
  const fs::path path = fs::temp_directory_path() / ("sha-" + std::to_string(getpid()));
  std::ofstream(path) << "abc";
  absl::StatusOr<std::string> sha = Sha256OfFile(path.string());
  fs::remove(path);
  ASSERT_TRUE(sha.ok());
  EXPECT_EQ(*sha, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

}  // namespace
}  // namespace ringmaster
