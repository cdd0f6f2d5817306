// Who calls the coordinator, and what each caller may do. A caller is a user (a bearer token from
// the token file, or a user certificate), a worker (a certificate in the workers group), or, on a
// coordinator with no authentication configured (plaintext on loopback), the anonymous operator.
//
// Certificates follow Kubernetes' convention: the subject's CN is the name, each O a group. Token
// files are Kubernetes' static token file: one `token,user,uid,"group1,group2"` line per token.
#pragma once

#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ringmaster {

inline constexpr char kDefaultAdminGroup[] = "ringmaster:admins";
inline constexpr char kDefaultWorkerGroup[] = "ringmaster:workers";

struct Principal {
  std::string name;  // "" for the anonymous operator
  std::vector<std::string> groups;
  bool admin = false;   // may act on every job
  bool worker = false;  // may register a worker daemon; may not submit
  // How it was authenticated, for messages: "certificate", "token", "none".
  std::string via;

  // The anonymous operator of a coordinator without authentication: may do everything.
  static Principal Anonymous();
  // "user 'alice'", "worker 'host-a'", "the anonymous operator".
  std::string Describe() const;
  bool InGroup(absl::string_view group) const;
};

// The O (organization) values of an RFC 2253 subject, e.g. "CN=alice,O=team-a,O=ringmaster:admins"
// gives {"team-a", "ringmaster:admins"}; escaped characters ("\,") are unescaped.
std::vector<std::string> OrganizationsOf(absl::string_view subject);

struct TokenEntry {
  std::string user;
  std::string uid;
  std::vector<std::string> groups;
};

// A Kubernetes static token file: `token,user,uid[,"group1,group2"]` per line; blank lines and
// lines starting with '#' skipped. INVALID_ARGUMENT naming the line that is malformed (a token or
// user missing, a token twice); the tokens themselves never appear in a message.
absl::StatusOr<absl::flat_hash_map<std::string, TokenEntry>> ParseTokenFile(absl::string_view text);

// The token file at `path`, read again when its modification time or size changes (checked at most
// once per `recheck`). A file that becomes malformed keeps the last good contents, and says why in
// the log. Thread-safe.
class TokenFile {
 public:
  // INVALID_ARGUMENT when the file cannot be read or parsed at start.
  static absl::StatusOr<std::unique_ptr<TokenFile>> Open(std::string path,
                                                         absl::Duration recheck = absl::Seconds(1));

  // The entry of `token`; NOT_FOUND when there is none.
  absl::StatusOr<TokenEntry> Lookup(absl::string_view token);

 private:
  TokenFile(std::string path, absl::Duration recheck) : path_(std::move(path)), recheck_(recheck) {}
  // Reads the file again when its modification time or size changed. REQUIRES: mu_ not held.
  void Reload() ABSL_LOCKS_EXCLUDED(mu_);

  const std::string path_;
  const absl::Duration recheck_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, TokenEntry> tokens_ ABSL_GUARDED_BY(mu_);
  absl::Time checked_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t mtime_ns_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t size_ ABSL_GUARDED_BY(mu_) = -1;
};

}  // namespace ringmaster
