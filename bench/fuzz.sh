#!/usr/bin/env bash
# Runs each libFuzzer target (tests/fuzz) for SECONDS (default 60), starting from its committed
# corpus, and prints what each did: inputs run, corpus size, crashes. A crash leaves its input in
# build-fuzz/crashes/TARGET/ and makes the script exit 1 (add it to the target's corpus as a
# regression once fixed).
#
#   bench/fuzz.sh [SECONDS]        # Clang with libFuzzer and ASan (Debian's clang), in build-fuzz/
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-60}
build=${RINGMASTER_FUZZ_BUILD_DIR:-$root/build-fuzz}
targets=(fuzz_proto_convert fuzz_local_frame fuzz_negotiator fuzz_rendezvous_store fuzz_principal)
command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ is not installed (scripts/install-deps.sh)" >&2; exit 1; }
CC=clang CXX=clang++ cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRINGMASTER_FUZZ=ON \
  -DRINGMASTER_WITH_CUDA=OFF >/dev/null
cmake --build "$build" -j "${RINGMASTER_BUILD_JOBS:-2}" --target "${targets[@]}" >/dev/null
failed=0
printf '%-24s %10s %10s %8s %8s\n' target inputs exec/s corpus crashes
for t in "${targets[@]}"; do
  work="$build/corpus/$t" crashes="$build/crashes/$t"
  mkdir -p "$work" "$crashes"
  log="$build/$t.log"
  rc=0
  # New inputs go to the working corpus; the committed one is read only. ASan: leaks are reported.
  "$build/bin/$t" "$work" "$root/tests/fuzz/corpus/$t" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=2048 -max_len=65536 -artifact_prefix="$crashes/" -print_final_stats=1 \
    >"$log" 2>&1 || rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  corpus=$(find "$work" "$root/tests/fuzz/corpus/$t" -type f | wc -l)
  found=$(find "$crashes" -type f | wc -l)
  printf '%-24s %10s %10s %8s %8s\n' "$t" "${runs:-?}" "${speed:-?}" "$corpus" "$found"
  if ((rc != 0 || found > 0)); then
    failed=1
    echo "fuzz.sh: $t failed (exit $rc); its log: $log" >&2
    grep -m5 -E "ERROR|SUMMARY|Test unit written" "$log" >&2 || true
  fi
done
exit "$failed"
