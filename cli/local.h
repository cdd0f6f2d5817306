// `ringmaster local`: horovodrun -np N on one machine. Starts a coordinator and N worker daemons (K
// per simulated host) from the directory of the ringmaster executable, registers the job, prints
// its output with "[rank] " prefixes until it ends, and stops every process it started on every
// exit path.
#pragma once

#include "cli/command.h"

namespace ringmaster::cli {

// Returns the exit status: 0 when the job SUCCEEDED, 1 when it failed (the reason on stderr) or
// ringmaster could not run it, 128 + N when interrupted by signal N.
int Local(const Global& g, Args& args);

}  // namespace ringmaster::cli
