// Fuzz target: the text the coordinator reads about callers: a token file and a certificate's
// subject.
#include <cstdint>
#include <string>

#include "coordinator/principal.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  (void)ringmaster::ParseTokenFile(text);
  (void)ringmaster::OrganizationsOf(text);
  return 0;
}
