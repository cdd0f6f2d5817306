#include "worker/local/local_server.h"

#include <fcntl.h>
#include <grp.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/framing.h"
#include "spdlog/spdlog.h"

namespace ringmaster {

class LocalConnection {
 public:
  LocalConnection(int fd, PeerCredentials peer) : fd_(fd), peer_(peer) {}
  ~LocalConnection() { close(fd_); }
  int fd() const { return fd_; }
  const PeerCredentials& peer() const { return peer_; }

  void Send(const v1::LocalReply& reply, int pass_fd = -1) {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    if (!WriteFrame(fd_, reply).ok() || (pass_fd >= 0 && !SendFd(fd_, pass_fd).ok()))
      closed_ = true;
  }
  void Shutdown() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    shutdown(fd_, SHUT_RDWR);
  }

 private:
  const int fd_;
  const PeerCredentials peer_;
  absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

absl::StatusOr<std::unique_ptr<LocalServer>> LocalServer::Start(const std::string& path,
                                                                Handler* handler,
                                                                const SocketAccess& access) {
  gid_t group_id = static_cast<gid_t>(-1);
  if (uint32_t number = 0; absl::SimpleAtoi(access.group, &number)) {
    group_id = static_cast<gid_t>(number);  // a gid: no entry in /etc/group needed (containers)
  } else if (!access.group.empty()) {
    const struct group* g = getgrnam(access.group.c_str());
    if (g == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("--socket-group '", access.group, "' is not a group on this host"));
    }
    group_id = g->gr_gid;
  }
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--socket '", path, "' must be 1..", sizeof(addr.sun_path) - 1, " bytes"));
  }
  const std::string in_use = absl::StrCat(
      "--socket ", path,
      " is in use: another ringmaster-worker serves it (give each worker its own --socket)");
  // PATH.lock, held for the server's life, makes claiming the path atomic: two workers started at
  // once on a dead daemon's socket cannot both take it over.
  const std::string lock_path = absl::StrCat(path, ".lock");
  const int lock_fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot create ", lock_path, ": ", std::strerror(errno)));
  }
  if (flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    close(lock_fd);
    return absl::FailedPreconditionError(in_use);
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    close(lock_fd);
    return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  // A path that exists is replaced only when it is a socket nobody answers on (left by a daemon
  // that died): a live one belongs to another worker, whose training processes would lose it.
  if (struct stat st; lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      close(fd);
      close(lock_fd);
      return absl::FailedPreconditionError(
          absl::StrCat("--socket ", path, " exists and is not a socket; choose another path"));
    }
    const int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool answered =
        probe >= 0 && connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    if (probe >= 0) close(probe);
    if (answered) {  // a server that holds no lock (an older worker's)
      close(fd);
      close(lock_fd);
      return absl::FailedPreconditionError(in_use);
    }
    unlink(path.c_str());
  }
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 64) != 0) {
    absl::Status s =
        absl::UnavailableError(absl::StrCat("cannot listen on ", path, ": ", std::strerror(errno)));
    close(fd);
    close(lock_fd);
    return s;
  }
  // Only the daemon's user and its group may connect, whatever the umask said (the arena goes to
  // whoever attaches).
  if (chmod(path.c_str(), access.mode) != 0 ||
      (group_id != static_cast<gid_t>(-1) &&
       chown(path.c_str(), static_cast<uid_t>(-1), group_id) != 0)) {
    absl::Status s = absl::UnavailableError(
        absl::StrCat("cannot set the mode or group of ", path, ": ", std::strerror(errno)));
    close(fd);
    close(lock_fd);
    unlink(path.c_str());
    return s;
  }
  struct stat bound {};
  stat(path.c_str(), &bound);
  auto server = std::unique_ptr<LocalServer>(new LocalServer(path, fd, handler));
  server->socket_device_ = bound.st_dev;
  server->socket_inode_ = bound.st_ino;
  server->lock_fd_ = lock_fd;
  server->acceptor_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

LocalServer::LocalServer(std::string path, int listen_fd, Handler* handler)
    : path_(std::move(path)), listen_fd_(listen_fd), handler_(handler) {}

LocalServer::~LocalServer() { Stop(); }

void LocalServer::AcceptLoop() {
  while (!stopping_) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (!stopping_) spdlog::error("accept on {}: {}", path_, std::strerror(errno));
      return;
    }
    // A training process that stops reading its completions must not block the engine forever:
    // a write that cannot proceed for 10 s fails and closes the connection.
    timeval send_timeout{10, 0};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof(send_timeout));
    ucred cred{};
    socklen_t len = sizeof(cred);
    PeerCredentials peer;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
      peer = PeerCredentials{.pid = cred.pid, .uid = cred.uid, .gid = cred.gid};
    }
    auto connection = std::make_shared<LocalConnection>(fd, peer);
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    connections_.push_back(connection);
    readers_.Start([this, connection] { Serve(connection); });
  }
}

namespace {

// Refuses the connection's request `handle` with `code` and `why`, and closes the connection.
void RefuseAndClose(LocalConnection& connection, uint64_t handle, absl::StatusCode code,
                    const std::string& why) {
  v1::LocalReply reply;
  reply.mutable_completion()->set_handle(handle);
  reply.mutable_completion()->set_code(static_cast<int>(code));
  reply.mutable_completion()->set_message(why);
  connection.Send(reply);
  connection.Shutdown();
}

}  // namespace

bool LocalServer::Hello(LocalConnection& connection, const v1::LocalHello& hello,
                        std::optional<v1::LocalWelcome>& welcomed) {
  v1::LocalReply reply;
  if (welcomed.has_value()) {  // one process, one welcome
    reply.mutable_completion()->set_code(static_cast<int>(absl::StatusCode::kFailedPrecondition));
    reply.mutable_completion()->set_message("this connection was already welcomed");
    connection.Send(reply);
    return true;
  }
  absl::StatusOr<Handler::Welcome> welcome = handler_->OnHello(hello, connection.peer());
  if (!welcome.ok()) {
    RefuseAndClose(connection, 0, welcome.status().code(), std::string(welcome.status().message()));
    return false;
  }
  *reply.mutable_welcome() = welcome->message;
  connection.Send(reply, welcome->arena_fd);
  if (welcome->arena_fd >= 0) close(welcome->arena_fd);
  welcomed = welcome->message;
  return true;
}

void LocalServer::Serve(std::shared_ptr<LocalConnection> connection) {
  std::weak_ptr<LocalConnection> weak = connection;
  std::optional<v1::LocalWelcome> welcomed;
  v1::LocalRequest request;
  bool open = true;
  while (open && ReadFrame(connection->fd(), &request).ok()) {
    // A connection acts only once welcomed: anything else before (or after a refused hello) is
    // refused and the connection closed, so a process the daemon did not admit can never enqueue
    // into, or free memory of, the arena of the rank it serves.
    if (request.kind_case() != v1::LocalRequest::kHello &&
        request.kind_case() != v1::LocalRequest::KIND_NOT_SET && !welcomed.has_value()) {
      spdlog::warn("local connection (pid {}): message {} before a welcome refused; closed",
                   connection->peer().pid, static_cast<int>(request.kind_case()));
      RefuseAndClose(
          *connection,
          request.kind_case() == v1::LocalRequest::kEnqueue ? request.enqueue().handle() : 0,
          absl::StatusCode::kPermissionDenied,
          "this connection was not welcomed (its hello was refused or never sent): it may send "
          "nothing else; connect again and say hello");
      break;
    }
    switch (request.kind_case()) {
      case v1::LocalRequest::kHello:
        open = Hello(*connection, request.hello(), welcomed);
        break;
      case v1::LocalRequest::kEnqueue:
        handler_->OnEnqueue(&*welcomed, request.enqueue(), [weak](const v1::LocalCompletion& c) {
          if (auto conn = weak.lock()) {
            v1::LocalReply reply;
            *reply.mutable_completion() = c;
            conn->Send(reply);
          }
        });
        break;
      case v1::LocalRequest::kRelease:
        handler_->OnRelease(&*welcomed, request.release());
        break;
      case v1::LocalRequest::kReadyEvents:
        if (absl::Status s = handler_->OnReadyEvents(request.ready_events()); !s.ok()) {
          spdlog::warn("local connection: ready events refused: {}", s.ToString());
          connection->Shutdown();
        }
        break;
      case v1::LocalRequest::KIND_NOT_SET:
        break;
    }
  }
  handler_->OnDisconnect(welcomed.has_value() ? &*welcomed : nullptr);
  absl::MutexLock lock(&mu_);
  for (auto it = connections_.begin(); it != connections_.end(); ++it) {
    if (*it == connection) {
      connections_.erase(it);
      break;
    }
  }
}

void LocalServer::DisconnectAll() {
  absl::MutexLock lock(&mu_);
  for (auto& c : connections_) c->Shutdown();
}

void LocalServer::Stop() {
  if (stopping_.exchange(true)) return;
  shutdown(listen_fd_, SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();
  close(listen_fd_);
  {
    absl::MutexLock lock(&mu_);
    for (auto& c : connections_) c->Shutdown();
  }
  readers_.JoinAll();
  // Only the socket this server created: the path may since have been taken over by another.
  if (struct stat st;
      stat(path_.c_str(), &st) == 0 && st.st_dev == socket_device_ && st.st_ino == socket_inode_) {
    unlink(path_.c_str());
  }
  // Unlinked while still held, so a worker that opens PATH.lock afterwards creates a fresh one.
  unlink(absl::StrCat(path_, ".lock").c_str());
  close(lock_fd_);
}

}  // namespace ringmaster
