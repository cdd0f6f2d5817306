#include "coordinator/principal.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringmaster {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(OrganizationsOf, ReadsEveryOFromAnRfc2253Subject) {
  EXPECT_THAT(OrganizationsOf("CN=alice,O=team-a,O=ringmaster:admins"),
              ElementsAre("team-a", "ringmaster:admins"));
  EXPECT_THAT(OrganizationsOf("O=ringmaster:workers,CN=host-a"), ElementsAre("ringmaster:workers"));
  EXPECT_THAT(OrganizationsOf("CN=x,O=Acme\\, Inc.,OU=ml"), ElementsAre("Acme, Inc."));
  EXPECT_THAT(OrganizationsOf("CN=user"), IsEmpty());
  EXPECT_THAT(OrganizationsOf(""), IsEmpty());
}

TEST(ParseTokenFile, ReadsKubernetesStaticTokenLines) {
  absl::StatusOr<absl::flat_hash_map<std::string, TokenEntry>> tokens = ParseTokenFile(
      "# users\n"
      "tok-a,alice,1001,\"team-a,ringmaster:admins\"\n"
      "\n"
      "tok-b,bob,1002\n");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  ASSERT_EQ(tokens->size(), 2u);
  EXPECT_EQ(tokens->at("tok-a").user, "alice");
  EXPECT_EQ(tokens->at("tok-a").uid, "1001");
  EXPECT_THAT(tokens->at("tok-a").groups, ElementsAre("team-a", "ringmaster:admins"));
  EXPECT_EQ(tokens->at("tok-b").user, "bob");
  EXPECT_THAT(tokens->at("tok-b").groups, IsEmpty());
}

TEST(ParseTokenFile, NamesTheBadLineWithoutTheToken) {
  absl::StatusOr<absl::flat_hash_map<std::string, TokenEntry>> tokens =
      ParseTokenFile("tok-a,alice,1\nsecret-token-only\n");
  EXPECT_EQ(tokens.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tokens.status().message(),
            "line 2: expected token,user,uid[,\"group1,group2\"] with a token and a user");
  tokens = ParseTokenFile("tok-a,alice,1\ntok-a,bob,2\n");
  EXPECT_EQ(tokens.status().message(), "line 2: the token of user 'bob' is given twice");
}

TEST(TokenFile, IsReadAgainWhenItChanges) {
  const std::string path = absl::StrCat(std::filesystem::temp_directory_path().string(),
                                        "/ringmaster-tokens-", getpid(), ".csv");
  std::ofstream(path) << "tok-a,alice,1\n";
  absl::StatusOr<std::unique_ptr<TokenFile>> file = TokenFile::Open(path, absl::ZeroDuration());
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->Lookup("tok-a")->user, "alice");
  EXPECT_EQ((*file)->Lookup("tok-b").status().code(), absl::StatusCode::kNotFound);
  std::ofstream(path)
      << "tok-b,bob,2,\"g\"\n";  // another size: seen even within the same mtime tick
  EXPECT_EQ((*file)->Lookup("tok-b")->user, "bob");
  EXPECT_EQ((*file)->Lookup("tok-a").status().code(), absl::StatusCode::kNotFound);
  std::ofstream(path) << "broken\n";  // kept: the last good contents
  EXPECT_EQ((*file)->Lookup("tok-b")->user, "bob");
  std::filesystem::remove(path);
  EXPECT_EQ(TokenFile::Open(path).status().message(),
            absl::StrCat("--token-file ", path, ": cannot be read"));
}

TEST(Principal, DescribesItself) {
  EXPECT_EQ(Principal::Anonymous().Describe(), "the anonymous operator");
  EXPECT_TRUE(Principal::Anonymous().admin);
  EXPECT_EQ((Principal{.name = "alice", .via = "token"}).Describe(), "user 'alice'");
  EXPECT_EQ((Principal{.name = "host-a", .worker = true, .via = "certificate"}).Describe(),
            "worker 'host-a'");
}

}  // namespace
}  // namespace ringmaster
