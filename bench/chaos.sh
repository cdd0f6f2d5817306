#!/usr/bin/env bash
# The chaos suite at larger counts, as recorded in docs/benchmarks.md: coordinator kill -9 at random
# moments of 4-rank jobs (--kills, default 100), session resets at random messages (--reset-jobs
# jobs, default 12), a daemon kill, and the leader of two coordinator replicas on etcd killed at
# random moments (--leader-kills, default 20; lease TTL 2 s). Every trial is checked exactly (tests/chaos/test_chaos.py); the
# figures: trials, hangs (a job not ended within its bound fails the run), how long after a restart
# every rank was back, and the first negotiated cycle.
#   bench/chaos.sh [--kills 100] [--reset-jobs 12] [--leader-kills 20] [--seed N]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
kills=100
reset_jobs=12
leader_kills=20
seed=$(date +%s)
while (($#)); do
  case $1 in
    --kills) kills=$2; shift 2 ;;
    --reset-jobs) reset_jobs=$2; shift 2 ;;
    --leader-kills) leader_kills=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    *) echo "chaos.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
"$root/scripts/install-deps.sh"
[[ -x $root/build/bin/train_loop ]] || "$root/scripts/build.sh" >/dev/null
report=$(mktemp)
trap 'rm -f "$report"' EXIT
status=0
RINGMASTER_BIN_DIR="$root/build/bin" RINGMASTER_CHAOS_KILLS=$kills \
  RINGMASTER_CHAOS_RESET_JOBS=$reset_jobs RINGMASTER_CHAOS_LEADER_KILLS=$leader_kills \
  RINGMASTER_CHAOS_SEED=$seed \
  RINGMASTER_CHAOS_REPORT=$report \
  /usr/bin/python3 -m pytest -q -p no:cacheprovider "$root/tests/chaos/test_chaos.py" || status=$?
/usr/bin/python3 - "$report" "$seed" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
kills = [r for r in rows if r["kind"] == "coordinator_kill"]
resets = [r for r in rows if r["kind"] == "session_resets"]
def ms(v):
    return "-" if v is None else f"{v * 1000:.0f} ms"
print(f"seed {sys.argv[2]}")
ok = sum(r["state"] == "JOB_STATE_SUCCEEDED" for r in kills)
print(f"coordinator kill -9: {len(kills)} trials, {ok} SUCCEEDED with every step exact, "
      f"{len(kills) - ok} not")
for s in (r for r in rows if r["kind"] == "coordinator_kill_summary"):
    print(f"  resumed mid-job: {s['resumed']} (the others were killed before placement or after "
          f"the end); every rank back after the restart: median {ms(s['reattach_median_s'])}, "
          f"max {ms(s['reattach_max_s'])}; first negotiated cycle: median "
          f"{ms(s['first_cycle_median_s'])}, max {ms(s['first_cycle_max_s'])}")
ok = sum(r["state"] == "JOB_STATE_SUCCEEDED" for r in resets)
print(f"session resets: {sum(r['resets'] for r in resets)} injected over {len(resets)} jobs, "
      f"{ok} SUCCEEDED with every step exact, 0 hangs" if ok == len(resets) else
      f"session resets: {len(resets) - ok} jobs did not succeed")
leaders = [r for r in rows if r["kind"] == "leader_kill"]
ok = sum(r["state"] == "JOB_STATE_SUCCEEDED" for r in leaders)
for s in (r for r in rows if r["kind"] == "leader_kill_summary"):
    print(f"leader kill -9 (2 replicas on etcd, lease TTL {s['ttl_s']} s): {len(leaders)} trials, "
          f"{ok} SUCCEEDED with every step exact; takeover: median {ms(s['takeover_median_s'])}, "
          f"max {ms(s['takeover_max_s'])}; kill to the first negotiated cycle ({s['resumed']} "
          f"resumed mid-job): median {ms(s['first_cycle_median_s'])}, "
          f"max {ms(s['first_cycle_max_s'])}")
PY
exit $status
