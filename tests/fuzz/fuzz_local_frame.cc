// Fuzz target: the worker's local API as a training process's bytes reach it: length-prefixed
// frames read from a socket (common/framing.h), each parsed as a LocalRequest.
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <thread>

#include "common/framing.h"
#include "ringmaster/v1/local.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return 0;
  std::thread writer([&] {
    size_t off = 0;
    while (off < size) {
      const ssize_t n = write(fds[1], data + off, size - off);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
    shutdown(fds[1], SHUT_WR);
  });
  ringmaster::v1::LocalRequest request;
  for (int frames = 0; frames < 1024 && ringmaster::ReadFrame(fds[0], &request).ok(); ++frames) {
    (void)request.kind_case();
  }
  close(fds[0]);  // a writer blocked on a full socket fails now
  writer.join();
  close(fds[1]);
  return 0;
}
