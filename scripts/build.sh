#!/usr/bin/env bash
# Installs missing dependencies, then configures and builds Ringmaster into build/ (executables in
# build/bin/). Extra arguments go to cmake's configure step, e.g. -DCMAKE_BUILD_TYPE=Release.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
jobs=${RINGMASTER_BUILD_JOBS:-2}
cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo ${RINGMASTER_CMAKE_ARGS:-} "$@" >/dev/null
cmake --build "$root/build" -j "$jobs"
