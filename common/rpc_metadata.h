// Metadata entries of Ringmaster's gRPC calls, shared by the clients that set them and the
// coordinator that reads them.
#pragma once

namespace ringmaster {

// A rendezvous call's proof that it comes from the job's ranks: JobAssignment.rendezvous_token.
inline constexpr char kRendezvousTokenMetadata[] = "x-ringmaster-rendezvous-token";

// A user's bearer token: "authorization: Bearer TOKEN".
inline constexpr char kAuthorizationMetadata[] = "authorization";

// A coordinator replica that does not lead names the leader's address in this trailer of the
// UNAVAILABLE it answers every call with.
inline constexpr char kLeaderMetadata[] = "x-ringmaster-leader";

}  // namespace ringmaster
