#!/usr/bin/env bash
# Runs every test that needs no GPU: installs missing dependencies, builds, then ctest (C++ unit and
# service tests, the Python API test). GPU tests carry the ctest label `gpu` and are left out here.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/build.sh"
cd "$root/build"
# Every coordinator and daemon the tests start aborts on a lock taken against an order seen before
# (printing both stacks): a lock-order inversion fails a test every time, not one run in a thousand.
export RINGMASTER_MUTEX_DEADLOCK_DETECTION="${RINGMASTER_MUTEX_DEADLOCK_DETECTION:-abort}"
ctest -LE gpu --output-on-failure --timeout 300 -j "${RINGMASTER_TEST_JOBS:-2}"
