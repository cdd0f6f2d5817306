// The job flags `submit` and `local` share: --np, --processes-per-host, --name, --env, --label,
// --working-dir and every knob (see the usage text), then `-- CMD ARGS...`.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "cli/command.h"
#include "ringmaster/v1/job.pb.h"

namespace ringmaster::cli {

// Called for a flag that is not a job flag; returns whether it took it (reading its value from
// `args`). Lets a command add flags of its own.
using ExtraFlag = std::function<bool(const std::string& flag, Args& args)>;

// Reads job flags up to "--", then the command. Knobs start from Horovod's environment variables
// (HOROVOD_FUSION_THRESHOLD, ...); flags win. The name defaults to the command's base name. A usage
// error (exit 2, naming `command`) for an unknown flag, a bad value or a missing --np.
//
// A timeline or autotune log given as a path (HOROVOD_TIMELINE=/tmp/run/timeline.json, as Horovod
// users write it) becomes the artifact named by its last component; `requested_paths` (when given)
// maps that name to the path asked for, so `ringmaster local` can write the file there.
v1::JobSpec ParseJobSpec(const std::string& command, Args& args, const ExtraFlag& extra = nullptr,
                         std::map<std::string, std::string>* requested_paths = nullptr);

}  // namespace ringmaster::cli
