#!/bin/sh
# `ringmaster local` end to end with real worker daemons: rank-prefixed output, the exit status and
# reason of a failing job, Ctrl-C and kill -9, and that no ringmaster-coordinator or ringmaster-worker
# of a run outlives it. Skipped (exit 77) while ringmaster-worker is not built.
#
#   tests/cli/local_test.sh BIN_DIR
set -u
bin=${1:?usage: local_test.sh BIN_DIR}
if [ ! -x "$bin/ringmaster-worker" ]; then
  echo "SKIP: $bin/ringmaster-worker does not exist (build the ringmaster-worker target first)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0

fail() {
  echo "FAIL: $*"
  echo "--- stdout"; cat "$tmp/out"
  echo "--- stderr"; cat "$tmp/err"
  status=1
}

# Whether process $1 exists and is not a zombie.
alive() {
  [ -r "/proc/$1/stat" ] && ! sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | grep -q '^Z'
}

# Starts `ringmaster local ARGS...` in the background: $pid; stdout and stderr in $tmp/out, $tmp/err.
start_local() {
  : > "$tmp/children"
  "$bin/ringmaster" local "$@" > "$tmp/out" 2> "$tmp/err" &
  pid=$!
}

# Records the children of $pid (the coordinator and the workers) while it runs, for at most $1
# seconds (then kills it: a hang is a failure); sets $rc.
await_local() {
  end=$(( $(date +%s) + $1 ))
  while alive "$pid"; do
    cat /proc/"$pid"/task/*/children >> "$tmp/children" 2>/dev/null
    if [ "$(date +%s)" -ge "$end" ]; then
      fail "ringmaster local ran over $1 s"
      kill -KILL "$pid"
    fi
    sleep 0.05
  done
  wait "$pid"
  rc=$?
}

# Fails when a ringmaster process started by run $pid is still alive after $1 seconds, or (unless $2
# is "keep-sockets") a worker socket of the run is left.
check_no_leftovers() {
  end=$(( $(date +%s) + $1 ))
  for child in $(tr ' ' '\n' < "$tmp/children" | sort -u); do
    while alive "$child" && tr '\0' ' ' < "/proc/$child/cmdline" 2>/dev/null | grep -q ringmaster; do
      if [ "$(date +%s)" -ge "$end" ]; then
        fail "left behind: $child $(tr '\0' ' ' < "/proc/$child/cmdline")"
        kill -KILL "$child"
        break
      fi
      sleep 0.05
    done
  done
  # Workers carry the run's pid in their socket path.
  if pgrep -f "/tmp/ringmaster-$pid-" > /dev/null 2>&1; then
    fail "a worker of run $pid is left: $(pgrep -af "/tmp/ringmaster-$pid-")"
  fi
  if [ "${2:-}" != keep-sockets ] && ls /tmp/ringmaster-"$pid"-*.sock > /dev/null 2>&1; then
    fail "sockets left: $(ls /tmp/ringmaster-"$pid"-*.sock)"
  fi
  rm -f /tmp/ringmaster-"$pid"-*.sock
}

echo "== two ranks on two hosts say hello"
start_local --np 2 --processes-per-host 1 -- sh -c 'echo hello from $HOROVOD_RANK of $HOROVOD_SIZE'
await_local 60
[ "$rc" -eq 0 ] || fail "exit status $rc, expected 0"
grep -qx '\[0\] hello from 0 of 2' "$tmp/out" || fail "no line '[0] hello from 0 of 2'"
grep -qx '\[1\] hello from 1 of 2' "$tmp/out" || fail "no line '[1] hello from 1 of 2'"
check_no_leftovers 0

echo "== three ranks on one host: every collective exact (a number of ranks that is not a power of two)"
start_local --np 3 -- "$bin/collectives_check"
await_local 120
[ "$rc" -eq 0 ] || fail "exit status $rc, expected 0"
[ "$(grep -c '^\[[012]\] collectives_check: rank [012]: [0-9]* checks passed, 0 failed$' "$tmp/out")" -eq 3 ] ||
  fail "not three ranks with every check passed"
check_no_leftovers 0

echo "== a failing rank fails the run with the job's reason"
start_local --np 2 --processes-per-host 1 -- sh -c 'echo oops >&2; exit 3'
await_local 60
[ "$rc" -ne 0 ] || fail "exit status 0, expected non-zero"
grep -q '^ringmaster local: job FAILED: .*exited with status 3' "$tmp/err" ||
  fail "no 'ringmaster local: job FAILED: ... exited with status 3' on stderr"
grep -qx '\[[01]\] oops' "$tmp/err" || fail "the rank's stderr is not on stderr"
check_no_leftovers 0

echo "== Ctrl-C cancels the job and stops everything"
start_local --np 2 -- sh -c 'echo started; exec sleep 61.4242'
end=$(( $(date +%s) + 60 ))
until grep -q '^\[1\] started' "$tmp/out" || [ "$(date +%s)" -ge "$end" ] || ! alive "$pid"; do
  cat /proc/"$pid"/task/*/children >> "$tmp/children" 2>/dev/null
  sleep 0.05
done
kill -INT "$pid"
await_local 30
[ "$rc" -eq 130 ] || fail "exit status $rc after SIGINT, expected 130"
grep -q '^ringmaster local: job CANCELLED: cancelled: interrupted by SIGINT' "$tmp/err" ||
  fail "no 'job CANCELLED: cancelled: interrupted by SIGINT' on stderr"
check_no_leftovers 0
sleep 1
pgrep -f 'sleep 61.4242' > /dev/null && fail "a training process outlived the run"

echo "== kill -9 of ringmaster local takes its children with it"
start_local --np 2 -- sh -c 'echo started; exec sleep 61.4343'
end=$(( $(date +%s) + 60 ))
until grep -q '^\[1\] started' "$tmp/out" || [ "$(date +%s)" -ge "$end" ] || ! alive "$pid"; do
  cat /proc/"$pid"/task/*/children >> "$tmp/children" 2>/dev/null
  sleep 0.05
done
kill -KILL "$pid"
await_local 10
check_no_leftovers 5 keep-sockets  # nothing ran to remove them
sleep 1
pgrep -f 'sleep 61.4343' > /dev/null && fail "a training process outlived the killed run"

[ "$status" -eq 0 ] && echo "PASS"
exit "$status"
