// Transport security for Ringmaster's gRPC: mutual TLS from PEM files, with the file names that
// Kubernetes TLS secrets and cert-manager write (tls.crt, tls.key, ca.crt). The files are watched:
// a certificate or CA replaced on disk is used for new connections within kTlsReloadInterval, so
// rotation needs no restart.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace grpc {
class ChannelCredentials;
class ServerCredentials;
}  // namespace grpc

namespace ringmaster {

inline constexpr absl::Duration kTlsReloadInterval = absl::Seconds(2);

struct TlsFiles {
  std::string cert;  // PEM certificate (chain), e.g. tls.crt
  std::string key;   // PEM private key of `cert`, e.g. tls.key
  std::string ca;    // PEM CA bundle the peer's certificate must chain to, e.g. ca.crt

  // Whether any file is named: TLS is on.
  bool enabled() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

// The flags' values, each one empty falling back to the environment (RINGMASTER_TLS_CERT,
// RINGMASTER_TLS_KEY, RINGMASTER_TLS_CA).
TlsFiles TlsFilesFrom(std::string cert_flag, std::string key_flag, std::string ca_flag);

// For a server: cert, key and ca all named and readable PEM. For a client: ca named, cert and key
// both or neither (a client without a certificate authenticates by token). INVALID_ARGUMENT naming
// the flag, or the file and why it cannot be used.
absl::Status CheckServerTlsFiles(const TlsFiles& files);
absl::Status CheckClientTlsFiles(const TlsFiles& files);

// Server credentials: TLS with `files` (client certificates requested and, when sent, verified
// against the CA), or plaintext when !files.enabled(). REQUIRES: CheckServerTlsFiles(files).ok().
std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const TlsFiles& files);

// Channel credentials: TLS verifying the server's certificate against the CA and its name against
// the target's host, presenting `files.cert` when named; plaintext when !files.enabled().
// REQUIRES: CheckClientTlsFiles(files).ok().
std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(const TlsFiles& files);

}  // namespace ringmaster
