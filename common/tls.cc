#include "common/tls.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_certificate_verifier.h"
#include "grpcpp/security/tls_credentials_options.h"

namespace ringmaster {
namespace {

std::string FromEnv(std::string flag, const char* name) {
  if (!flag.empty()) return flag;
  const char* env = std::getenv(name);
  return env != nullptr ? env : "";
}

// OK when `path` can be read and holds a PEM block of `kind` ("CERTIFICATE", "PRIVATE KEY").
absl::Status CheckPem(const std::string& flag, const std::string& path, const char* kind) {
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": cannot be read: ", std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  // "-----BEGIN PRIVATE KEY-----", "-----BEGIN RSA PRIVATE KEY-----", "-----BEGIN EC PRIVATE
  // KEY-----"
  const std::string contents = text.str();
  if (!absl::StrContains(contents, "-----BEGIN ") ||
      !absl::StrContains(contents, absl::StrCat(kind, "-----"))) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": not a PEM file with a ", kind));
  }
  return absl::OkStatus();
}

std::shared_ptr<grpc::experimental::CertificateProviderInterface> Provider(const TlsFiles& files) {
  const int refresh = static_cast<int>(absl::ToInt64Seconds(kTlsReloadInterval));
  if (files.cert.empty()) {
    return std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(files.ca, refresh);
  }
  return std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(files.key, files.cert,
                                                                              files.ca, refresh);
}

}  // namespace

TlsFiles TlsFilesFrom(std::string cert_flag, std::string key_flag, std::string ca_flag) {
  return TlsFiles{.cert = FromEnv(std::move(cert_flag), "RINGMASTER_TLS_CERT"),
                  .key = FromEnv(std::move(key_flag), "RINGMASTER_TLS_KEY"),
                  .ca = FromEnv(std::move(ca_flag), "RINGMASTER_TLS_CA")};
}

absl::Status CheckServerTlsFiles(const TlsFiles& files) {
  if (files.cert.empty() || files.key.empty() || files.ca.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs all three of --tls-cert, --tls-key and --tls-ca (or RINGMASTER_TLS_CERT, "
        "RINGMASTER_TLS_KEY, RINGMASTER_TLS_CA): a Kubernetes TLS secret's tls.crt, tls.key and "
        "ca.crt");
  }
  if (absl::Status s = CheckPem("--tls-cert", files.cert, "CERTIFICATE"); !s.ok()) return s;
  if (absl::Status s = CheckPem("--tls-key", files.key, "PRIVATE KEY"); !s.ok()) return s;
  return CheckPem("--tls-ca", files.ca, "CERTIFICATE");
}

absl::Status CheckClientTlsFiles(const TlsFiles& files) {
  if (files.ca.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs --tls-ca (RINGMASTER_TLS_CA): the CA that signed the coordinator's certificate");
  }
  if (files.cert.empty() != files.key.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert and --tls-key (RINGMASTER_TLS_CERT, RINGMASTER_TLS_KEY) go together: give "
        "both, or neither to authenticate by --token");
  }
  if (!files.cert.empty()) {
    if (absl::Status s = CheckPem("--tls-cert", files.cert, "CERTIFICATE"); !s.ok()) return s;
    if (absl::Status s = CheckPem("--tls-key", files.key, "PRIVATE KEY"); !s.ok()) return s;
  }
  return CheckPem("--tls-ca", files.ca, "CERTIFICATE");
}

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const TlsFiles& files) {
  if (!files.enabled()) return grpc::InsecureServerCredentials();
  grpc::experimental::TlsServerCredentialsOptions options(Provider(files));
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  // Requested, and verified when sent; a caller without one must bring a bearer token (checked
  // per call), so users need not hold certificates.
  options.set_cert_request_type(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  return grpc::experimental::TlsServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(const TlsFiles& files) {
  if (!files.enabled()) return grpc::InsecureChannelCredentials();
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(Provider(files));
  options.watch_root_certs();
  if (!files.cert.empty()) options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);
  // The server's certificate must name the host dialled (a DNS or IP subject alternative name).
  options.set_certificate_verifier(
      std::make_shared<grpc::experimental::HostNameCertificateVerifier>());
  return grpc::experimental::TlsCredentials(options);
}

}  // namespace ringmaster
