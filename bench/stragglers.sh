#!/usr/bin/env bash
# Who is slow (docs/operations.md, "Finding a slow rank"), as recorded in docs/benchmarks.md: how
# many steps after real slowness begins the coordinator names the right rank and cause, for each
# kind of slowness, and what the workers' figures cost.
#
#   compute   a rank that sleeps 150 ms longer before it submits (4 ranks, two hosts on loopback)
#   cpu       a rank whose process a cgroup limits to a tenth of a CPU, each rank computing 20 ms
#             of CPU a step (needs root and writable cgroups)
#   link      a host whose eth0 tc shapes to 40 Mbit/s (4 ranks on two hosts that are network
#             namespaces; needs root)
#   cost      build/bin/ringmaster-execution-clocks-bench: Executed(), a communicator call's
#             NetworkEnter/Leave, and the reporter's Read() of 2, 64 and 1023 connections
#
# Each scenario runs its test (tests/observability/test_stragglers.py,
# tests/multihost/test_multihost.py) --repeats times and prints the lines that say when the rank
# was named. Needs a build (scripts/build.sh).
#
#   sudo bench/stragglers.sh [--repeats 3]
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=3
while [[ $# -gt 0 ]]; do
  case "$1" in
    --repeats) repeats="$2"; shift 2 ;;
    *) echo "usage: bench/stragglers.sh [--repeats N]" >&2; exit 2 ;;
  esac
done
export RINGMASTER_BIN_DIR="${RINGMASTER_BIN_DIR:-$PWD/build/bin}"
py=/usr/bin/python3
run() {  # label, pytest arguments...
  local label="$1"; shift
  for ((i = 1; i <= repeats; i++)); do
    out=$("$py" -m pytest -q -p no:cacheprovider -rs -s "$@" 2>&1 || true)
    named=$(grep -E '^named ' <<<"$out" | head -1 | cut -c1-160)
    verdict=$(grep -oE '"verdict": "[a-z ]+"' <<<"$named" | head -1 || true)
    result=$(grep -E '[0-9]+ (passed|failed|skipped)' <<<"$out" | tail -1)
    echo "$label run $i: ${named:-not named} ... [$result]"
  done
}
run compute tests/observability/test_stragglers.py -k computes_longer
run cpu tests/observability/test_stragglers.py -k cpu_is_limited
run link tests/multihost/test_multihost.py -k slow_link
echo "cost: $("$RINGMASTER_BIN_DIR/ringmaster-execution-clocks-bench")"
