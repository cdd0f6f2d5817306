// The daemon's local API: a Unix domain socket where training processes say hello, enqueue
// collectives (never blocking) and receive completions as they happen. One thread accepts; one
// thread per connection reads; completions are written from whichever thread completes, under the
// connection's write lock.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/thread_list.h"
#include "ringmaster/v1/local.pb.h"

namespace ringmaster {

class LocalConnection;

// Who is on the other end of a connection, as the kernel says (SO_PEERCRED), not as it claims.
struct PeerCredentials {
  pid_t pid = -1;
  uid_t uid = static_cast<uid_t>(-1);
  gid_t gid = static_cast<gid_t>(-1);
};

// Who may connect: the socket file's mode, and its group ("": the daemon's own).
struct SocketAccess {
  mode_t mode = 0660;
  std::string group;
};

class LocalServer {
 public:
  class Handler {
   public:
    virtual ~Handler() = default;
    struct Welcome {
      v1::LocalWelcome message;
      // Passed to the process with the welcome (SCM_RIGHTS), then closed: the handler hands over
      // its own descriptor (a dup), so the job's arena may go meanwhile.
      int arena_fd = -1;
    };
    // The welcome for a new training process, or an error to send it (e.g. no job yet, or a
    // `peer` that may not attach).
    virtual absl::StatusOr<Welcome> OnHello(const v1::LocalHello& hello,
                                            const PeerCredentials& peer) = 0;
    // Only a welcomed connection's requests come here: any message but a hello before a welcome,
    // or after a refused hello, is refused (PERMISSION_DENIED) by the server and the connection
    // closed. `welcome` (never null): what the connection was welcomed with.
    // `reply` may be called from any thread, once per enqueue, even after the connection closed.
    virtual void OnEnqueue(const v1::LocalWelcome* welcome, const v1::LocalEnqueue& enqueue,
                           std::function<void(const v1::LocalCompletion&)> reply) = 0;
    virtual void OnRelease(const v1::LocalWelcome* welcome, const v1::LocalRelease& release) = 0;
    // GPU daemons: the training process's interprocess ready events. An error closes the
    // connection.
    virtual absl::Status OnReadyEvents(const v1::LocalReadyEvents& events) {
      return absl::FailedPreconditionError("this worker daemon serves a CPU slot: no CUDA events");
    }
    // A connection closed; `welcome` is what it received when it was a training process that was
    // welcomed, nullptr otherwise.
    virtual void OnDisconnect(const v1::LocalWelcome* welcome) = 0;
  };

  // Listens on `path`, holding `path`.lock (flock) until Stop(). A socket file there that nobody
  // answers on (a dead daemon's) is replaced; FAILED_PRECONDITION when another server holds the
  // lock or answers there, or the path is not a socket. `handler` is borrowed.
  // The socket file gets `access` (INVALID_ARGUMENT for an unknown group).
  static absl::StatusOr<std::unique_ptr<LocalServer>> Start(const std::string& path,
                                                            Handler* handler,
                                                            const SocketAccess& access = {});
  ~LocalServer();  // Stop()s

  // Closes the listener and every connection, joins the threads, removes the socket file (only if
  // the path still names the one it created).
  void Stop();
  // Closes every connection (the job ended); keeps listening.
  void DisconnectAll();

  const std::string& path() const { return path_; }

 private:
  LocalServer(std::string path, int listen_fd, Handler* handler);
  void AcceptLoop();
  void Serve(std::shared_ptr<LocalConnection> connection);
  // A hello on `connection`: welcomed (kept in `welcomed`), refused (the connection closed: false),
  // or a second hello answered FAILED_PRECONDITION.
  bool Hello(LocalConnection& connection, const v1::LocalHello& hello,
             std::optional<v1::LocalWelcome>& welcomed);

  const std::string path_;
  const int listen_fd_;
  // The socket file this server created (unlinked at Stop() only if the path still names it).
  dev_t socket_device_ = 0;
  ino_t socket_inode_ = 0;
  int lock_fd_ = -1;  // PATH.lock, flock()ed from Start() to Stop()
  Handler* const handler_;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  absl::Mutex mu_;
  std::vector<std::shared_ptr<LocalConnection>> connections_ ABSL_GUARDED_BY(mu_);
  ThreadList readers_;  // one per connection
};

}  // namespace ringmaster
