#include "common/secret.h"

#include <string>

#include "gtest/gtest.h"

namespace ringmaster {
namespace {

TEST(SecretTest, HmacSha256MatchesRfc4231) {
  // RFC 4231, test cases 1 and 2.
  EXPECT_EQ(HmacSha256Hex(std::string(20, '\x0b'), "Hi There"),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(HmacSha256Hex("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(SecretTest, Sha256AndRandomSecrets) {
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string a = RandomSecret();
  EXPECT_EQ(a.size(), 64u);
  EXPECT_NE(a, RandomSecret());
  EXPECT_TRUE(ConstantTimeEquals(a, a));
  EXPECT_FALSE(ConstantTimeEquals(a, RandomSecret()));
  EXPECT_FALSE(ConstantTimeEquals("ab", "abc"));
}

}  // namespace
}  // namespace ringmaster
