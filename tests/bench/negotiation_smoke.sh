#!/usr/bin/env bash
# bench/negotiation.sh as docs/benchmarks.md runs it, small: 16 simulated ranks, 4 per host, a relay
# for every 2 hosts. Every line it promises is there, and the relayed run completes its steps, so
# the coordinator took the simulated relays' batches as the job's relay plan has them (a refused
# batch would leave its step unanswered, and the benchmark would fail at its 60 s step timeout).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$("$root/bench/negotiation.sh" --ranks 16 --steps 10 --per-host 4 --relay-hosts 2)
echo "$out"
fail() { echo "negotiation_smoke: $*" >&2; exit 1; }
num='[0-9]+\.[0-9]+'
grep -Eq "^logic +resnet50 +ranks= +16 " <<<"$out" || fail "no logic line for 16 ranks"
grep -Eq "^grpc +resnet50 +ranks= +16 .* answer-p50=$num ms  coordinator-cpu/step=$num ms  coordinator-switches/step=[0-9]+$" <<<"$out" ||
  fail "no grpc line for 16 ranks with answer-p50, coordinator CPU and switches"
relayed=$(grep -E "^grpc-relay-h2 +resnet50 +ranks= +16 " <<<"$out") || fail "no grpc-relay-h2 line"
# Positive times: the steps were answered.
p50=$(sed -E 's/.* p50= *([0-9.]+) ms .*/\1/' <<<"$relayed")
answer=$(sed -E 's/.*answer-p50=([0-9.]+) ms.*/\1/' <<<"$relayed")
awk -v a="$p50" -v b="$answer" 'BEGIN { exit !(a > 0 && b > 0 && b <= a) }' ||
  fail "relayed step p50 $p50 ms, answer p50 $answer ms"
echo "negotiation_smoke: ok"
