// Authentication of the coordinator's callers, per call: a bearer token ("authorization: Bearer
// T", looked up in the token file), else the verified client certificate (CN the name, O the
// groups), else, on a coordinator without authentication, the anonymous operator. The rules of
// what each caller may do live with the services; this only says who calls.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/rpc_metadata.h"
#include "coordinator/principal.h"

namespace grpc {
class ServerContextBase;
}

namespace ringmaster {

struct AuthOptions {
  // Every call must authenticate (TLS or a token file is configured). When false, a caller with
  // no credentials is the anonymous operator, who may do everything.
  bool required = false;
  std::shared_ptr<TokenFile> tokens;  // null: bearer tokens are not accepted
  std::string admin_group = kDefaultAdminGroup;
  std::string worker_group = kDefaultWorkerGroup;
};

// Thread-safe.
class Authenticator {
 public:
  explicit Authenticator(AuthOptions options = {}) : options_(std::move(options)) {}

  // UNAUTHENTICATED saying why (no credentials, an unknown token, a certificate without a CN).
  absl::StatusOr<Principal> Authenticate(const grpc::ServerContextBase& context) const;

  const AuthOptions& options() const { return options_; }

  // The bearer token the call carries where there is a token file ("" otherwise).
  std::string BearerToken(const grpc::ServerContextBase& context) const;
  // Whether `token` is still in the token file (read again when it changed).
  bool TokenValid(absl::string_view token) const;

 private:
  Principal WithRoles(Principal p) const;

  const AuthOptions options_;
};

// The value of metadata entry `key` of the call ("" when absent).
std::string MetadataValue(const grpc::ServerContextBase& context, const std::string& key);

// Whether `p` may see and act on `job_owner`'s job: PERMISSION_DENIED naming both otherwise.
absl::Status MayAccessJob(const Principal& p, const std::string& job_id,
                          const std::string& job_owner, const std::string& admin_group);

}  // namespace ringmaster
