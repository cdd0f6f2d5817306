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

// The directory of the running executable, where the coordinator and worker binaries are built too.
std::string ExecutableDir();

// Whether a variable of the caller's environment goes to the job's processes: PATH, PYTHONPATH,
// HOME, LANG, LC_ALL and every HOROVOD_*, RINGMASTER_* and NCCL_* variable, except
// RINGMASTER_COORDINATOR (it would name the caller's coordinator, not the job's) and
// RINGMASTER_TOKEN (the caller's credential).
bool Inherited(const std::string& key);

// Adds the caller's inherited variables to the spec's environment (--env wins). PYTHONPATH is
// prefixed with the build tree's python/ (next to `bin_dir`) when it exists, so a built
// `ringmaster` Python package is found, and PATH with `bin_dir`.
void InheritCallerEnvironment(const std::string& bin_dir, v1::JobSpec* spec);

// The job options of `submit` and `local`, as their --help lists them.
extern const char kJobOptionsHelp[];

}  // namespace ringmaster::cli
