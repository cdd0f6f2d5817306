#include "common/framing.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "google/protobuf/message_lite.h"

namespace ringmaster {
namespace {

absl::Status WriteAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    ssize_t w = send(fd, data, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return absl::UnavailableError(absl::StrCat("write: ", std::strerror(errno)));
    data += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

// false at a clean end of stream before any byte.
absl::Status ReadAll(int fd, char* data, size_t n, bool* eof) {
  size_t got = 0;
  *eof = false;
  while (got < n) {
    ssize_t r = read(fd, data + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return absl::UnavailableError(absl::StrCat("read: ", std::strerror(errno)));
    if (r == 0) {
      *eof = got == 0;
      return absl::UnavailableError("connection closed");
    }
    got += static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

// ReadAll, each read waited for until `deadline` at most.
absl::Status ReadAllBy(int fd, char* data, size_t n, absl::Time deadline) {
  size_t got = 0;
  while (got < n) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError("the peer sent its frame too slowly");
    }
    const int64_t ms = absl::ToInt64Milliseconds(left + absl::Microseconds(999));  // rounded up
    pollfd p{fd, POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(std::min<int64_t>(ms, 60'000)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return absl::UnavailableError(absl::StrCat("poll: ", std::strerror(errno)));
    if (ready == 0) continue;  // the deadline is checked above
    ssize_t r = read(fd, data + got, n - got);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r < 0) return absl::UnavailableError(absl::StrCat("read: ", std::strerror(errno)));
    if (r == 0) return absl::UnavailableError("connection closed");
    got += static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

// One frame: its 4-byte little-endian length, then its body, each read with `read_all`. A length
// over `max_bytes` is refused naming `limit`.
absl::Status ReadFrameWith(absl::FunctionRef<absl::Status(char* data, size_t n)> read_all,
                           google::protobuf::MessageLite* message, uint32_t max_bytes,
                           absl::string_view limit) {
  unsigned char header[4];
  if (absl::Status s = read_all(reinterpret_cast<char*>(header), 4); !s.ok()) return s;
  const uint32_t n = header[0] | header[1] << 8 | header[2] << 16 | uint32_t{header[3]} << 24;
  if (n > max_bytes)
    return absl::DataLossError(absl::StrCat("frame of ", n, " bytes exceeds ", limit));
  std::string body(n, '\0');
  if (absl::Status s = read_all(body.data(), n); !s.ok()) return s;
  if (!message->ParseFromString(body)) return absl::DataLossError("malformed frame");
  return absl::OkStatus();
}

}  // namespace

absl::Status ReadFrameBy(int fd, google::protobuf::MessageLite* message, uint32_t max_bytes,
                         absl::Time deadline) {
  return ReadFrameWith([&](char* data, size_t n) { return ReadAllBy(fd, data, n, deadline); },
                       message, max_bytes, absl::StrCat(max_bytes));
}

absl::Status WriteFrame(int fd, const google::protobuf::MessageLite& message) {
  std::string buffer(4, '\0');
  const size_t n = message.ByteSizeLong();
  for (int i = 0; i < 4; ++i) buffer[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  message.AppendToString(&buffer);
  return WriteAll(fd, buffer.data(), buffer.size());
}

absl::Status ReadFrame(int fd, google::protobuf::MessageLite* message) {
  bool eof;
  return ReadFrameWith([&](char* data, size_t n) { return ReadAll(fd, data, n, &eof); }, message,
                       kMaxFrameBytes, "the 64 MiB limit");
}

absl::Status SendFd(int socket, int fd) {
  char byte = 'F';
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  cmsg->cmsg_level = SOL_SOCKET;
  cmsg->cmsg_type = SCM_RIGHTS;
  cmsg->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
  while (sendmsg(socket, &msg, MSG_NOSIGNAL) < 0) {
    if (errno != EINTR)
      return absl::UnavailableError(absl::StrCat("sendmsg: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> ReceiveFd(int socket) {
  char byte;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  while ((n = recvmsg(socket, &msg, MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR) {
  }
  if (n <= 0)
    return absl::UnavailableError("connection closed before the arena descriptor arrived");
  cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  if (cmsg == nullptr || cmsg->cmsg_type != SCM_RIGHTS) {
    return absl::DataLossError("expected the arena descriptor");
  }
  int fd;
  std::memcpy(&fd, CMSG_DATA(cmsg), sizeof(int));
  return fd;
}

}  // namespace ringmaster
