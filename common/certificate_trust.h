// Whether a peer's certificate still chains to the CA bundle a server trusts now: the bundle is
// read again when it changes, so a certificate whose CA left the bundle (a rotation away from it)
// or that expired is seen as untrusted, and the sessions it opened can be ended.
//
// Thread-compatible: one owner (the server's ticker) calls Refresh() and Trusted().
#pragma once

#include <memory>
#include <string>

#include "absl/strings/string_view.h"

namespace ringmaster {

class CertificateTrust {
 public:
  explicit CertificateTrust(std::string ca_path);
  ~CertificateTrust();
  CertificateTrust(const CertificateTrust&) = delete;
  CertificateTrust& operator=(const CertificateTrust&) = delete;

  // Reads the bundle again when its modification time or size changed; true when it did (or on
  // the first call). A bundle that cannot be read keeps the last one.
  bool Refresh();
  // Whether `pem` (a peer's leaf certificate) verifies against the bundle now: signed by one of its
  // CAs and within its validity period. False for what does not parse.
  bool Trusted(absl::string_view pem) const;

 private:
  struct Store;
  const std::string ca_path_;
  std::unique_ptr<Store> store_;
  long long mtime_ns_ = -1;
  long long size_ = -1;
};

}  // namespace ringmaster
