// The coordinator's state directory holds live secrets (jobs' environments in jobs.db and its
// WAL, the ranks' output in logs/, artifacts): it must be readable by the coordinator's user alone,
// whatever the umask and whoever made the directory (systemd's StateDirectory=, a volume).
#pragma once

#include <string>

#include "absl/status/status.h"

namespace ringmaster {

// Makes `dir` private: creates it (and its parents) if missing; an existing directory this user
// owns is tightened to 0700 and everything in it to 0600 (files) and 0700 (directories).
// FAILED_PRECONDITION (its message to follow the directory's name) with its owner and mode, and
// what to do, when another user
// owns it and lets others in (it cannot be tightened); one that lets nobody else in but its group
// (a Kubernetes volume's fsGroup) is accepted, its contents tightened. Does file I/O.
absl::Status MakeStateDirPrivate(const std::string& dir);

}  // namespace ringmaster
