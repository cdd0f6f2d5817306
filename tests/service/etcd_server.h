// A real etcd (Debian's etcd-server, installed by scripts/install-deps.sh) for a test: started on
// loopback with its own data directory, killed and removed by the destructor. Ports come from the
// pid, in a range nothing else here uses, so concurrent tests do not collide.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace ringmaster {

class EtcdServer {
 public:
  static constexpr char kBinary[] = "/usr/bin/etcd";
  static bool Installed() { return access(kBinary, X_OK) == 0; }

  // `tag` names the data directory. Starts it; ready() once `answers` says it answers (polled for
  // up to 20 s).
  EtcdServer(const std::string& tag, const std::function<bool(const std::string& url)>& answers)
      : dir_(absl::StrCat(std::filesystem::temp_directory_path().string(), "/", tag, "_",
                          getpid())) {
    const int client = FreePort(), peer = FreePort();
    url_ = absl::StrCat("etcd://127.0.0.1:", client);
    const std::string c = absl::StrCat("http://127.0.0.1:", client);
    const std::string p = absl::StrCat("http://127.0.0.1:", peer);
    std::vector<std::string> argv = {kBinary,
                                     "--name=t",
                                     "--data-dir=" + dir_,
                                     "--listen-client-urls=" + c,
                                     "--advertise-client-urls=" + c,
                                     "--listen-peer-urls=" + p,
                                     "--initial-advertise-peer-urls=" + p,
                                     "--initial-cluster=t=" + p,
                                     "--log-level=error"};
    pid_ = fork();
    if (pid_ == 0) {
      // Quiet (raft logs its elections on stderr whatever the level).
      const int null = open("/dev/null", O_WRONLY);
      dup2(null, 1);
      dup2(null, 2);
      std::vector<char*> args;
      for (std::string& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      execv(kBinary, args.data());
      _exit(127);
    }
    for (int i = 0; pid_ > 0 && i < 200; ++i) {
      if (answers(url_)) {
        ready_ = true;
        return;
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
  }

  ~EtcdServer() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    std::error_code error;
    std::filesystem::remove_all(dir_, error);
  }

  bool ready() const { return ready_; }
  const std::string& url() const { return url_; }  // etcd://127.0.0.1:PORT
  std::string endpoint() const { return url_.substr(7); }

 private:
  static int FreePort() {
    static int next = 0;
    return 23000 + (getpid() % 500) * 4 + (next++ % 4);
  }

  const std::string dir_;
  std::string url_;
  pid_t pid_ = -1;
  bool ready_ = false;
};

}  // namespace ringmaster
