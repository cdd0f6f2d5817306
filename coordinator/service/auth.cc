#include "coordinator/service/auth.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpc/grpc_security_constants.h"
#include "grpcpp/security/auth_context.h"
#include "grpcpp/server_context.h"

namespace ringmaster {

std::string MetadataValue(const grpc::ServerContextBase& context, const std::string& key) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(key);
  if (it == metadata.end()) return "";
  return std::string(it->second.data(), it->second.size());
}

Principal Authenticator::WithRoles(Principal p) const {
  p.admin = p.InGroup(options_.admin_group);
  // Only a worker certificate makes a worker: a token, whatever groups its line names, is a user.
  p.worker = p.via == "certificate" && p.InGroup(options_.worker_group);
  return p;
}

std::string Authenticator::BearerToken(const grpc::ServerContextBase& context) const {
  if (options_.tokens == nullptr) return "";
  const std::string authorization = MetadataValue(context, kAuthorizationMetadata);
  constexpr absl::string_view kBearer = "Bearer ";
  if (!absl::StartsWithIgnoreCase(authorization, kBearer)) return "";
  return std::string(
      absl::StripAsciiWhitespace(absl::string_view(authorization).substr(kBearer.size())));
}

bool Authenticator::TokenValid(absl::string_view token) const {
  return options_.tokens != nullptr && options_.tokens->Lookup(token).ok();
}

absl::StatusOr<Principal> Authenticator::Authenticate(
    const grpc::ServerContextBase& context) const {
  // A token is looked at only where there is a token file: elsewhere a leftover RINGMASTER_TOKEN
  // must not lock out a caller with a certificate.
  const std::string authorization =
      options_.tokens != nullptr ? MetadataValue(context, kAuthorizationMetadata) : "";
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  const bool certified = auth != nullptr && auth->IsPeerAuthenticated();
  if (!authorization.empty() && certified) {
    // Neither may win: a stolen token must not borrow a certificate's channel, nor a token
    // override who the certificate says the caller is.
    return absl::UnauthenticatedError(
        "the call carries two identities, a client certificate and a bearer token: send one "
        "(drop --token / RINGMASTER_TOKEN, or the client certificate)");
  }
  if (!authorization.empty()) {
    constexpr absl::string_view kBearer = "Bearer ";
    if (!absl::StartsWithIgnoreCase(authorization, kBearer)) {
      return absl::UnauthenticatedError("the authorization metadata is not \"Bearer TOKEN\"");
    }
    const absl::string_view token =
        absl::StripAsciiWhitespace(absl::string_view(authorization).substr(kBearer.size()));
    absl::StatusOr<TokenEntry> entry = options_.tokens->Lookup(token);
    if (!entry.ok()) {
      return absl::UnauthenticatedError("the bearer token is not in the coordinator's token file");
    }
    return WithRoles(Principal{.name = entry->user, .groups = entry->groups, .via = "token"});
  }
  if (certified) {
    std::vector<grpc::string_ref> cn = auth->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME);
    if (cn.empty() || cn.front().empty()) {
      return absl::UnauthenticatedError(
          "the client certificate has no subject common name (CN): the CN is the caller's name");
    }
    Principal p{.name = std::string(cn.front().data(), cn.front().size()), .via = "certificate"};
    for (const grpc::string_ref& subject :
         auth->FindPropertyValues(GRPC_X509_SUBJECT_PROPERTY_NAME)) {
      p.groups = OrganizationsOf(absl::string_view(subject.data(), subject.size()));
    }
    return WithRoles(std::move(p));
  }
  if (!options_.required) return Principal::Anonymous();
  return absl::UnauthenticatedError(
      "this coordinator requires authentication: a client certificate (--tls-cert, --tls-key) or "
      "a bearer token (--token or RINGMASTER_TOKEN)");
}

absl::Status MayAccessJob(const Principal& p, const std::string& job_id,
                          const std::string& job_owner, const std::string& admin_group) {
  if (p.admin || (!p.name.empty() && p.name == job_owner && !p.worker)) return absl::OkStatus();
  // The owner is not named: other users learn nothing of whose jobs there are.
  return absl::PermissionDeniedError(absl::StrCat(p.Describe(), " may not see or change job ",
                                                  job_id, ": it is not theirs (members of group ",
                                                  admin_group, " may act on every job)"));
}

}  // namespace ringmaster
