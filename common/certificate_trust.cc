#include "common/certificate_trust.h"

#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <sys/stat.h>

#include <utility>

namespace ringmaster {

struct CertificateTrust::Store {
  X509_STORE* store = nullptr;
  ~Store() {
    if (store != nullptr) X509_STORE_free(store);
  }
};

namespace {

// Every certificate of the PEM bundle at `path` in a new store; null when none could be read.
X509_STORE* LoadBundle(const std::string& path) {
  BIO* in = BIO_new_file(path.c_str(), "r");
  if (in == nullptr) return nullptr;
  X509_STORE* store = X509_STORE_new();
  int loaded = 0;
  while (X509* cert = PEM_read_bio_X509(in, nullptr, nullptr, nullptr)) {
    if (X509_STORE_add_cert(store, cert) == 1) ++loaded;
    X509_free(cert);
  }
  BIO_free(in);
  if (loaded == 0) {
    X509_STORE_free(store);
    return nullptr;
  }
  return store;
}

}  // namespace

CertificateTrust::CertificateTrust(std::string ca_path)
    : ca_path_(std::move(ca_path)), store_(std::make_unique<Store>()) {}

CertificateTrust::~CertificateTrust() = default;

bool CertificateTrust::Refresh() {
  struct stat st {};
  if (stat(ca_path_.c_str(), &st) != 0) return false;
  const long long mtime =
      static_cast<long long>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
  if (mtime == mtime_ns_ && static_cast<long long>(st.st_size) == size_) return false;
  X509_STORE* loaded = LoadBundle(ca_path_);
  if (loaded == nullptr) return false;  // keep the last good bundle
  mtime_ns_ = mtime;
  size_ = static_cast<long long>(st.st_size);
  if (store_->store != nullptr) X509_STORE_free(store_->store);
  store_->store = loaded;
  return true;
}

bool CertificateTrust::Trusted(absl::string_view pem) const {
  if (store_->store == nullptr || pem.empty()) return false;
  BIO* in = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  if (in == nullptr) return false;
  X509* leaf = PEM_read_bio_X509(in, nullptr, nullptr, nullptr);
  BIO_free(in);
  if (leaf == nullptr) return false;
  X509_STORE_CTX* ctx = X509_STORE_CTX_new();
  bool ok = false;
  if (ctx != nullptr && X509_STORE_CTX_init(ctx, store_->store, leaf, nullptr) == 1) {
    ok = X509_verify_cert(ctx) == 1;
  }
  if (ctx != nullptr) X509_STORE_CTX_free(ctx);
  X509_free(leaf);
  return ok;
}

}  // namespace ringmaster
