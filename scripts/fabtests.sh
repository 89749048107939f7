#!/usr/bin/env bash
# Runs libfabric's own test suite, fabtests 1.17, against xfabric's libfabric.so.1 over shm
# and tcp, and compares every result with the one written below: a regression (or a fix not
# yet recorded) fails the run.
#
#   scripts/fabtests.sh FABTESTS_BIN          # e.g. /work/ext/fabtests-install/bin
#   FABTESTS_BIN=... scripts/fabtests.sh
#   FABTESTS_LIB=system scripts/fabtests.sh FABTESTS_BIN   # Debian's libfabric instead
#
# fabtests is built outside this repository from ofiwg/libfabric's v1.17.0 sources
# (cd fabtests && ./autogen.sh && ./configure --with-libfabric=/usr && make). Without a build
# the script says so and exits 0. Client/server pairs run on 127.0.0.1 with out-of-band
# address exchange (-E); each server gets a port of its own (-B) so no run waits on another's
# TIME_WAIT.
set -uo pipefail
cd "$(dirname "$0")/.."

bin=${1:-${FABTESTS_BIN:-}}
if [[ -z "$bin" || ! -x "$bin/fi_getinfo_test" ]]; then
    echo "fabtests: skipped: no fabtests build given (pass its bin directory or set FABTESTS_BIN)"
    exit 0
fi
lib=${FABTESTS_LIB:-xfabric}
if [[ "$lib" == system ]]; then
    libpath=
else
    cargo build -q -j2 -p xfabric-capi || exit 1
    libpath=$(mktemp -d)
    trap 'rm -rf "$libpath"' EXIT
    cp "$PWD/target/debug/libfabric.so" "$libpath/libfabric.so.1"
fi

# name | arguments | unit or pair | expected on shm | expected on tcp   (xfabric's results;
# "any": either result is accepted, for the reason given below)
# Failing on purpose, with the reason:
#   fi_msg              FI_EP_MSG: xfabric has RDM endpoints only (Debian's shm has none either).
#   fi_rdm_shared_av    FI_SHARED_AV is not offered (Debian's shm and tcp do not either).
#   fi_rdm_deferred_wq  with -E its counters never reach the threshold it waits for, on every
#                       provider and library (the test's own defect).
#   fi_av_test (shm)    a bad FI_ADDR_STR address finds no provider (Debian's shm: the same).
#   fi_multi_mr         -FI_ENOSYS on shm and FI_ENODATA on tcp, as with Debian's library.
#   fi_rdm_stress       needs a JSON job file (-j); without one it exits with its usage, on
#                       every library.
# Either result:
#   fi_rdm_rma_trigger  both writes land, in order; the server then checks the received text's
#                       length with strlen, but neither write carries a NUL: byte 19 of its
#                       buffer is what the key exchange left there, the fourth byte of the MR
#                       key. xfabric's provider keys are random 64-bit values (a counter's small
#                       keys leave it 0), so the check passes one time in 256.
tests=(
    "fi_getinfo_test|-s 127.0.0.1 127.0.0.1|unit|pass|pass"
    "fi_av_test|-g 127.0.0.1 -n 1 -s 127.0.0.1 -e rdm|unit|fail|pass"
    "fi_dom_test|-n 2|unit|pass|pass"
    "fi_eq_test||unit|pass|pass"
    "fi_cq_test||unit|pass|pass"
    "fi_mr_test||unit|pass|pass"
    "fi_cntr_test||unit|pass|pass"
    "fi_av_xfer|-e rdm|pair|pass|pass"
    "fi_cq_data|-e rdm|pair|pass|pass"
    "fi_msg||pair|fail|fail"
    "fi_rdm||pair|pass|pass"
    "fi_rdm_rma_event||pair|pass|pass"
    "fi_rdm_rma_trigger||pair|any|any"
    "fi_rdm_tagged_peek||pair|pass|pass"
    "fi_rdm_shared_av||pair|fail|fail"
    "fi_multi_mr|-e rdm -V|pair|fail|fail"
    "fi_recv_cancel|-e rdm -V|pair|pass|pass"
    "fi_unexpected_msg|-e rdm -I 10|pair|pass|pass"
    "fi_bw|-e rdm -v -T 1|pair|pass|pass"
    "fi_rdm_pingpong|-I 5 -v|pair|pass|pass"
    "fi_rdm_tagged_pingpong|-I 5 -v|pair|pass|pass"
    "fi_rdm_tagged_bw|-I 5 -v|pair|pass|pass"
    "fi_rma_bw|-e rdm -o write -I 5|pair|pass|pass"
    "fi_rdm_atomic|-I 5 -o all|pair|pass|pass"
    "fi_rdm_cntr_pingpong|-I 5|pair|pass|pass"
    "fi_multi_recv|-e rdm -I 5|pair|pass|pass"
    "fi_rdm_stress||pair|fail|fail"
    "fi_rdm_deferred_wq||pair|fail|fail"
)

limit=60
port=$((20000 + RANDOM % 20000))
ran=0 passed=0 bad=0
for prov in shm tcp; do
    for t in "${tests[@]}"; do
        IFS='|' read -r name args kind want_shm want_tcp <<<"$t"
        want=$want_shm
        [[ $prov == tcp ]] && want=$want_tcp
        read -ra a <<<"$args"
        port=$((port + 2))
        env=(env FI_PROVIDER="$prov")
        [[ -n "$libpath" ]] && env+=(LD_LIBRARY_PATH="$libpath")
        if [[ $kind == unit ]]; then
            "${env[@]}" timeout $limit "$bin/$name" -p "$prov" "${a[@]}" >/dev/null 2>&1
            rc=$?
        else
            "${env[@]}" timeout $limit "$bin/$name" -p "$prov" "${a[@]}" -s 127.0.0.1 \
                -B $((port + 1)) -E=$port >/dev/null 2>&1 &
            srv=$!
            sleep 0.5
            "${env[@]}" timeout $limit "$bin/$name" -p "$prov" "${a[@]}" -s 127.0.0.1 \
                -E=$port 127.0.0.1 >/dev/null 2>&1
            rc=$?
            wait $srv
            src=$?
            ((rc == 0)) && rc=$src
        fi
        got=fail
        ((rc == 0)) && got=pass
        ran=$((ran + 1))
        [[ $got == pass ]] && passed=$((passed + 1))
        mark=ok
        if [[ $want != any && $got != "$want" ]]; then
            mark="UNEXPECTED (expected $want)"
            bad=$((bad + 1))
        fi
        printf '%-4s %-24s %-32s %-5s rc=%-4s %s\n' "$prov" "$name" "$args" "$got" "$rc" "$mark"
    done
done
echo "fabtests ($lib): $passed of $ran passed; $bad differ from the expected results"
if [[ "$lib" == system ]]; then
    exit 0 # the expectations are xfabric's
fi
((bad == 0))
