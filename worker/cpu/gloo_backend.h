// The CPU communicator: Gloo's TCP transport, connected as a full mesh through the job epoch's
// rendezvous store. Gloo reports failures by throwing; this backend catches every exception at the
// call and returns an absl::Status with Gloo's message kept:
//   UNAVAILABLE        I/O failure or a lost peer,
//   DEADLINE_EXCEEDED  a rendezvous wait or a collective that ran past `timeout`,
//   INTERNAL           anything else Gloo rejects.
// A failed collective leaves Gloo's pairs closed, so after the first failure every later call
// returns FAILED_PRECONDITION naming it; the engine rebuilds the communicator for the next epoch.
//
// Not thread-safe (see Backend): one engine thread owns the backend.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/backend.h"
#include "worker/rendezvous/key_value_store.h"

namespace ringmaster {

struct GlooBackendOptions {
  int rank = 0;
  int size = 1;
  // Rendezvous: each rank publishes its pair addresses under `prefix` + "<rank>" and reads the
  // others'. Only used while CreateGlooBackend() runs.
  std::shared_ptr<KeyValueStore> store;
  // Key prefix for this communicator, e.g. "gloo/"; distinct per communicator sharing a store.
  std::string prefix;
  // Where this rank listens: the address of network interface `iface` (e.g. "eth0", "lo") if set,
  // else `hostname` (a name or an address) if set, else 127.0.0.1, which only suits single-host
  // jobs.
  std::string iface;
  std::string hostname;
  // Bounds the rendezvous and every collective.
  absl::Duration timeout = absl::Seconds(30);
};

// Connects the full mesh through `options.store`: INVALID_ARGUMENT for bad options, else the
// rendezvous failure (DEADLINE_EXCEEDED when a rank never published its address) naming the rank.
//
// Gloo writes to its sockets with writev(2), which can raise SIGPIPE once a peer has gone; so that
// a lost peer is an error rather than a dead process, this sets SIGPIPE to SIG_IGN (process-wide)
// if it is at its default disposition.
absl::StatusOr<std::unique_ptr<Backend>> CreateGlooBackend(GlooBackendOptions options);

}  // namespace ringmaster
