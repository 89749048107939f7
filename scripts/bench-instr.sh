#!/usr/bin/env bash
# Instructions per round trip of benches/pingpong.rs under callgrind: deterministic, so it
# shows a change to the hot path on a machine too noisy for timings. One thread drives both
# endpoints, so a round trip is two sends, two receives and their completions, every empty
# poll in between included (over tcp the system calls' user-space side only).
#
#   scripts/bench-instr.sh [PROVIDER [CASE]]     # PROVIDER: shm (default) or tcp
#                                                # CASE: send/8 (default), inject/8, send/256, send/4096,
#                                                # send/65536, or idle: one CQ read that finds
#                                                # nothing (per read, not per round trip)
#   OUT=/tmp/x scripts/bench-instr.sh tcp        # keeps the callgrind profile as /tmp/x
#
# Compare two trees by running it in each. Needs valgrind (installed here if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
prov=${1:-shm}
case_=${2:-send/8}
command -v valgrind >/dev/null 2>&1 || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null
}
bin=$(cargo bench -j2 --bench pingpong --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "pingpong" and m.get("executable"):
        print(m["executable"])')
if [[ $case_ == idle ]]; then
    fn=idle_poll bench=${prov}_idle_poll unit=read
else
    fn=round_trip bench=${prov}_round_trip/$case_ unit="round trip"
fi
out=${OUT:-$(mktemp /tmp/xfabric-instr.XXXXXX)}
XFABRIC_BENCH_PROVIDER=$prov timeout 600 valgrind --tool=callgrind --callgrind-out-file="$out" \
    --toggle-collect="*$fn*" "$bin" --bench --profile-time 2 "$bench" >/dev/null 2>&1
# Calls: those into the function measured recorded in the profile; instructions: its summary.
python3 - "$out" "$prov" "$case_" "$fn" "$unit" <<'EOF'
import re, sys
path, prov, case, fn, unit = sys.argv[1:]
txt = open(path).read()
names = {m.group(1): m.group(2) for m in re.finditer(r'^c?fn=\((\d+)\) (.*)$', txt, re.M)}
ids = {k for k, v in names.items() if v.endswith('pingpong::' + fn)}
lines = txt.split('\n')
calls = 0
for i, l in enumerate(lines[:-1]):
    m = re.match(r'^cfn=\((\d+)\)', l)
    if m and m.group(1) in ids and lines[i + 1].startswith('calls='):
        calls += int(lines[i + 1].split('=')[1].split()[0])
total = int(re.search(r'^summary: (\d+)', txt, re.M).group(1))
if calls == 0:
    sys.exit(f'{path}: no calls of {fn} recorded')
print(f'{prov} {case}: {total // calls} instructions per {unit} ({calls} calls)')
EOF
[ -n "${OUT:-}" ] || rm -f "$out"
