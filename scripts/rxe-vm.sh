#!/usr/bin/env bash
# scripts/rxe-vm.sh - xfabric's runner for the verbs provider's tests (adapted from the shared
# tools' rxe-vm.sh): tests/verbs_vm.rs and scripts/test-verbs-vm.sh start prebuilt test
# binaries through it.
#
# Run one command inside a throwaway QEMU VM whose kernel has
# Soft-RoCE (rdma_rxe), with the host's filesystem visible, so a verbs
# program built on the host can be tested against a real kernel RDMA device
# on a machine that has no RDMA hardware and whose own kernel lacks
# CONFIG_INFINIBAND.
#
# Usage:  rxe-vm.sh [OPTIONS] -- COMMAND [ARGS...]
#
#   -v, --verbose     show the VM's console (kernel log, rxe setup) on stderr
#   --rw DIR          also share host directory DIR writable at the same path
#                     (repeatable; everything else is a read-only snapshot)
#   --pair            two devices: rxe0 on veth0 (192.0.2.1) and rxe1 on veth1
#                     (192.0.2.2); rxe0<->rxe1 traffic really crosses the veth
#                     pair (default: one device, rxe0 on dummy0, 192.0.2.1)
#   --mem MiB         guest memory (default 1024)
#   --cpus N          guest vCPUs (default 2)
#   --timeout SECS    kill the VM after SECS (exit status 124; default none)
#   --check           print why the VM cannot run here and exit 1, or exit 0 (installs
#                     nothing, boots nothing: what a test calls before it skips)
#   Environment: RXE_VM_ACCEL=kvm|tcg overrides the accelerator choice.
#
# Examples (GID index 1 is the IPv4-mapped RoCEv2 GID of 192.0.2.x):
#   rxe-vm.sh -- ibv_devinfo
#   rxe-vm.sh -- ./target/debug/my_verbs_test      # built on the host
#   rxe-vm.sh -- sh -c 'ibv_rc_pingpong -d rxe0 -g 1 & sleep 1;
#                       ibv_rc_pingpong -d rxe0 -g 1 127.0.0.1'
#   rxe-vm.sh --pair -- sh -c 'rping -s -a 192.0.2.1 -C 3 & sleep 1;
#                              rping -c -a 192.0.2.1 -I 192.0.2.2 -C 3 -v'
#   rxe-vm.sh -- cargo test      # works (writes land in the throwaway
#                                # overlay), but cargo itself is slow under
#                                # TCG: prefer running prebuilt test binaries
#   rxe-vm.sh --rw "$PWD/out" -- ./my_test --report out/r.json  # keep files
#
# What it installs (apt-get, only packages that are missing; needs root then):
#   qemu-system-x86, linux-image-amd64 (Debian's kernel: rdma_rxe, 9p and
#   overlay are modules there), busybox-static, cpio, kmod, iproute2 (`rdma`),
#   rdma-core, ibverbs-providers (librxe), ibverbs-utils, rdmacm-utils.
#
# What it does:
#   1. Picks the newest /boot/vmlinuz-* whose /lib/modules tree has rdma_rxe.
#   2. Builds (once, cached under /var/cache/rxe-vm) a tiny initramfs: static
#      busybox + the modules needed to mount the host's / over virtio-9p.
#   3. Boots QEMU with no network card at all (-nodefaults, nothing can leave
#      the VM). The guest mounts host / read-only under a tmpfs overlay
#      (writes inside the VM succeed but are thrown away), mounts a per-run
#      control directory and any --rw directories writable, chroots into it,
#      loads rdma_rxe/ib_uverbs/rdma_ucm, creates dummy0 (192.0.2.1/24,
#      TEST-NET, exists only inside the VM) and `rdma link add rxe0 type rxe
#      netdev dummy0` (or, with --pair, a veth pair and rxe0+rxe1), waits for
#      the ports to be ACTIVE, then runs COMMAND (as root, stdin /dev/null) in
#      the caller's working directory with the caller's environment.
#      Processes on rxe0 talk to each other through rxe's internal loopback.
#   4. COMMAND's stdout/stderr come back on this script's stdout/stderr
#      (virtio-serial ports, not ttys); the VM powers off; the script exits
#      with COMMAND's status (125 if the VM failed before/around COMMAND,
#      124 on --timeout). The console log is printed on failure.
#
# Accelerator: KVM when /dev/kvm is usable, except under a "PVM" nested host
# (/sys/module/kvm_pvm present), which cannot run an unmodified Debian kernel
# (boots ~30x slower than TCG, then dies on an emulation failure); there, and
# without /dev/kvm, it uses TCG (software emulation): boot ~3-5 s.
set -euo pipefail

prog=rxe-vm
die() { echo "$prog: $*" >&2; exit 125; }

verbose=0; mem=1024; cpus=2; timeout_s=0; pair=0; rw_dirs=(); check=0
while [ $# -gt 0 ]; do
  case "$1" in
    -v|--verbose) verbose=1; shift ;;
    --rw) [ $# -ge 2 ] || die "--rw needs a directory"; rw_dirs+=("$(realpath -e "$2")") || die "no such directory: $2"; shift 2 ;;
    --pair) pair=1; shift ;;
    --mem) mem=$2; shift 2 ;;
    --cpus) cpus=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --check) check=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    *) die "unknown option '$1' (usage: $0 [OPTIONS] -- COMMAND [ARGS...])" ;;
  esac
done
[ $# -gt 0 ] || [ "$check" = 1 ] || die "usage: $0 [OPTIONS] -- COMMAND [ARGS...]"
for d in "${rw_dirs[@]}"; do [ -d "$d" ] || die "--rw $d: not a directory"; done

# ---------------------------------------------------------------- packages
pkgs=(qemu-system-x86 linux-image-amd64 busybox-static cpio kmod iproute2
      rdma-core ibverbs-providers ibverbs-utils rdmacm-utils)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
done
if [ "$check" = 1 ]; then
  why=()
  [ ${#missing[@]} -eq 0 ] || why+=("packages missing: ${missing[*]} (scripts/setup.sh installs them)")
  ls /lib/modules/*/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko* >/dev/null 2>&1 \
    || why+=("no kernel with an rdma_rxe module under /lib/modules")
  [ ${#why[@]} -eq 0 ] || { echo "rxe-vm: cannot run: ${why[*]}"; exit 1; }
  exit 0
fi
if [ ${#missing[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || die "missing packages (${missing[*]}); run as root or install them"
  echo "$prog: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y --no-install-recommends "${missing[@]}" >/tmp/rxe-vm-apt.log 2>&1; then
    apt-get update >>/tmp/rxe-vm-apt.log 2>&1 || true
    apt-get install -y --no-install-recommends "${missing[@]}" >>/tmp/rxe-vm-apt.log 2>&1 \
      || { tail -20 /tmp/rxe-vm-apt.log >&2; die "apt-get install failed (log: /tmp/rxe-vm-apt.log)"; }
  fi
fi

# ---------------------------------------------------------------- kernel
kver=
for k in $(ls /boot/vmlinuz-* 2>/dev/null | sed 's|^/boot/vmlinuz-||' | sort -rV); do
  if ls /lib/modules/"$k"/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko* >/dev/null 2>&1; then kver=$k; break; fi
done
[ -n "$kver" ] || die "no /boot/vmlinuz-* with an rdma_rxe module under /lib/modules"
kernel=/boot/vmlinuz-$kver

# ---------------------------------------------------------------- initramfs
read -r -d '' guest_init <<'INIT' || true
#!/bin/busybox sh
# PID 1 inside the VM (runs from the initramfs).
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in $(cat /mods/order); do insmod /mods/$m 2>/dev/null || echo "rxe-vm: insmod $m failed"; done
ctl=; nrw=0
for a in $(cat /proc/cmdline); do
  case $a in rxevm.ctl=*) ctl=${a#rxevm.ctl=} ;; rxevm.nrw=*) nrw=${a#rxevm.nrw=} ;; esac
done
fail() { echo "rxe-vm: $*"; poweroff -f; sleep 5; }
# the kernel's module autoloader (request_module: e.g. the crc32 that rdma_rxe
# needs) runs /sbin/modprobe in the initramfs root: forward it to the host's
mkdir -p /sbin /lower /ovl /newroot
printf '#!/bin/sh\nexec chroot /newroot /sbin/modprobe "$@"\n' > /sbin/modprobe
chmod 755 /sbin/modprobe
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000 hostroot /lower || fail "9p mount of host / failed"
mount -t tmpfs -o mode=755 tmpfs /ovl; mkdir -p /ovl/u /ovl/w
mount -t overlay overlay -o lowerdir=/lower,upperdir=/ovl/u,workdir=/ovl/w /newroot || fail "overlay mount failed"
mount -t proc proc /newroot/proc
mount -t sysfs sys /newroot/sys
mount -t devtmpfs dev /newroot/dev
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666 devpts /newroot/dev/pts
mount -t tmpfs -o mode=1777 tmpfs /newroot/dev/shm
mount -t tmpfs -o mode=755 tmpfs /newroot/run
mkdir -p /newroot/$ctl
mount -t 9p -o trans=virtio,version=9p2000.L,cache=none,msize=512000 ctl /newroot/$ctl || fail "9p mount of control dir failed"
i=0
while [ $i -lt $nrw ]; do
  d=$(sed -n "$((i+1))p" /newroot/$ctl/rw.list)
  mkdir -p "/newroot$d"
  mount -t 9p -o trans=virtio,version=9p2000.L,cache=mmap,msize=512000 rw$i "/newroot$d" || fail "9p mount of $d failed"
  i=$((i+1))
done
out=/dev/null; err=/dev/null
for p in /sys/class/virtio-ports/*; do
  case $(cat $p/name 2>/dev/null) in out) out=/dev/${p##*/} ;; err) err=/dev/${p##*/} ;; esac
done
hostname rxe-vm
chroot /newroot /bin/bash --noprofile --norc "$ctl/stage2.sh" "$out" "$err" </dev/null
echo "rxe-vm: stage2 exited $?"
sync
poweroff -f
sleep 5
INIT

cache=/var/cache/rxe-vm
[ -w /var/cache ] || cache=${XDG_CACHE_HOME:-$HOME/.cache}/rxe-vm
mkdir -p "$cache"
modlist=$(for m in virtio_pci 9pnet_virtio 9p overlay virtio_console; do
            modprobe -S "$kver" --show-depends "$m"; done | awk '$1=="insmod"{print $2}' | awk '!seen[$0]++')
key=$( { echo "$guest_init"; echo "$modlist"; sha256sum /bin/busybox; } | sha256sum | cut -c1-16)
initrd=$cache/initrd-$kver-$key.img
if [ ! -s "$initrd" ]; then
  tmp=$(mktemp -d "$cache/build.XXXXXX")
  mkdir -p "$tmp"/{bin,mods,proc,sys,dev}
  cp /bin/busybox "$tmp/bin/busybox"
  printf '%s\n' "$guest_init" > "$tmp/init"; chmod 755 "$tmp/init"
  : > "$tmp/mods/order"
  for f in $modlist; do
    b=$(basename "$f"); case "$b" in
      *.ko.xz) xz -dc "$f" > "$tmp/mods/${b%.xz}"; b=${b%.xz} ;;
      *.ko.zst) zstd -qdc "$f" > "$tmp/mods/${b%.zst}"; b=${b%.zst} ;;
      *.ko.gz) gzip -dc "$f" > "$tmp/mods/${b%.gz}"; b=${b%.gz} ;;
      *) cp "$f" "$tmp/mods/$b" ;;
    esac
    echo "$b" >> "$tmp/mods/order"
  done
  (cd "$tmp" && find . -mindepth 1 | cpio -o -H newc --quiet | gzip -1) > "$tmp.img"
  mv "$tmp.img" "$initrd"; rm -rf "$tmp"
fi

# ---------------------------------------------------------------- accelerator
accel=${RXE_VM_ACCEL:-}
if [ -z "$accel" ]; then
  if [ -d /sys/module/kvm_pvm ]; then accel=tcg
  elif [ -r /dev/kvm ] && [ -w /dev/kvm ]; then accel=kvm
  else accel=tcg; fi
fi
case $accel in
  kvm) accel_args=(-accel kvm -cpu host) ;;
  tcg) accel_args=(-accel tcg,thread=multi -cpu max) ;;
  *) die "RXE_VM_ACCEL must be kvm or tcg" ;;
esac

# ---------------------------------------------------------------- per-run files
ctl=$(mktemp -d /tmp/rxe-vm.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$ctl"
}
trap cleanup EXIT
trap 'exit 130' INT; trap 'exit 143' TERM

printf '%s\n' "${rw_dirs[@]}" > "$ctl/rw.list"
{
  echo '#!/bin/bash'
  echo '# generated by rxe-vm.sh: runs inside the VM (chroot of the host filesystem)'
  echo 'out=$1; err=$2'
  echo 'exec </dev/null'
  echo 'export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
  printf 'ctl=%q; pair=%q\n' "$ctl" "$pair"
  cat <<'SETUP'
setup() {
  ip link set lo up
  for f in /proc/sys/net/ipv6/conf/{all,default}/accept_dad; do echo 0 > "$f"; done
  modprobe -a rdma_rxe ib_uverbs rdma_ucm || return 1
  if [ "$pair" = 0 ]; then
    modprobe dummy numdummies=0
    ip link add dummy0 type dummy
    ip addr add 192.0.2.1/24 dev dummy0
    ip link set dummy0 up
    rdma link add rxe0 type rxe netdev dummy0 || return 1
  else
    # veth0 (192.0.2.1) <-> veth1 (192.0.2.2) in one namespace. Normally the
    # kernel would deliver traffic between two local addresses through lo,
    # where rxe drops it; route locally-originated packets for the peer
    # address out of the other veth end instead, and accept them there.
    ip link add veth0 type veth peer name veth1
    ip addr add 192.0.2.1/24 dev veth0; ip addr add 192.0.2.2/24 dev veth1
    ip link set veth0 up; ip link set veth1 up
    for c in all default veth0 veth1; do
      echo 1 > /proc/sys/net/ipv4/conf/$c/accept_local
      echo 0 > /proc/sys/net/ipv4/conf/$c/rp_filter
    done
    ip rule add pref 10 iif lo to 192.0.2.1 table 101
    ip rule add pref 11 iif lo to 192.0.2.2 table 102
    ip route add 192.0.2.1 dev veth1 src 192.0.2.2 table 101
    ip route add 192.0.2.2 dev veth0 src 192.0.2.1 table 102
    ip rule del pref 0 table local; ip rule add pref 100 table local
    ip neigh add 192.0.2.1 lladdr "$(cat /sys/class/net/veth0/address)" dev veth1 nud permanent
    ip neigh add 192.0.2.2 lladdr "$(cat /sys/class/net/veth1/address)" dev veth0 nud permanent
    rdma link add rxe0 type rxe netdev veth0 || return 1
    rdma link add rxe1 type rxe netdev veth1 || return 1
  fi
  n=$((pair + 1))
  for _ in $(seq 100); do
    [ "$(grep -l ACTIVE /sys/class/infiniband/rxe*/ports/1/state 2>/dev/null | wc -l)" -ge $n ] &&
      [ "$(ls /dev/infiniband/uverbs* 2>/dev/null | wc -l)" -ge $n ] && break
    sleep 0.1
  done
  rdma link show
  ip -br addr
}
if ! setup; then echo "rxe-vm: rxe setup failed"; exit 1; fi
SETUP
  # the caller's environment and working directory
  while IFS= read -r -d '' kv; do
    name=${kv%%=*}
    [[ "$name" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || continue
    case $name in BASH*|SHELLOPTS|SHLVL|PWD|OLDPWD|_|HOSTNAME) continue ;; esac
    printf 'export %s=%q\n' "$name" "${kv#*=}"
  done < <(env -0)
  printf 'cd %q || exit 1\n' "$PWD"
  printf 'set --'; printf ' %q' "$@"; printf '\n'
  cat <<'RUN'
"$@" >"$out" 2>"$err"
rc=$?
echo "$rc" > "$ctl/rc"
exit "$rc"
RUN
} > "$ctl/stage2.sh"

# QEMU "pipe" chardevs write to NAME.out and read NAME.in (both FIFOs here)
for s in out err con; do mkfifo "$ctl/$s.in" "$ctl/$s.out"; done
cat "$ctl/out.out" & pids+=($!)
cat "$ctl/err.out" >&2 & pids+=($!)
if [ "$verbose" = 1 ]; then tee "$ctl/console.log" < "$ctl/con.out" >&2 & pids+=($!)
else cat "$ctl/con.out" > "$ctl/console.log" & pids+=($!); fi
reader_pids=("${pids[@]}")

qemu=(qemu-system-x86_64 "${accel_args[@]}" -m "$mem" -smp "$cpus"
  -nodefaults -no-user-config -display none -no-reboot -nic none
  -kernel "$kernel" -initrd "$initrd"
  -append "console=ttyS0 loglevel=4 panic=-1 rxevm.ctl=$ctl rxevm.nrw=${#rw_dirs[@]}"
  -chardev pipe,id=con,path="$ctl/con" -serial chardev:con
  -fsdev local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap
  -device virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot
  -fsdev local,id=ctl,path="$ctl",security_model=none
  -device virtio-9p-pci,fsdev=ctl,mount_tag=ctl
  -device virtio-serial-pci
  -chardev pipe,id=out,path="$ctl/out" -device virtserialport,chardev=out,name=out
  -chardev pipe,id=err,path="$ctl/err" -device virtserialport,chardev=err,name=err)
i=0
for d in "${rw_dirs[@]}"; do
  qemu+=(-fsdev local,id=rw$i,path="${d//,/,,}",security_model=none,multidevs=remap
         -device virtio-9p-pci,fsdev=rw$i,mount_tag=rw$i)
  i=$((i + 1))
done

if [ "$timeout_s" != 0 ]; then qemu=(timeout "$timeout_s" "${qemu[@]}"); fi
"${qemu[@]}" </dev/null 2>"$ctl/qemu.err" & qpid=$!
pids+=("$qpid")
qrc=0; wait "$qpid" || qrc=$?
# unblock readers whose FIFO QEMU never opened (O_RDWR open does not block)
for s in out err con; do exec 3<>"$ctl/$s.out"; exec 3>&-; done
for p in "${reader_pids[@]}"; do wait "$p" 2>/dev/null || true; done
pids=()

show_log() {
  [ -s "$ctl/qemu.err" ] && sed 's/^/qemu: /' "$ctl/qemu.err" >&2
  [ "$verbose" = 1 ] || { [ -s "$ctl/console.log" ] && tail -n 40 "$ctl/console.log" | sed 's/^/console: /' >&2; }
  true
}
if [ "$qrc" = 124 ]; then show_log; echo "$prog: timed out after ${timeout_s}s" >&2; exit 124; fi
if [ -s "$ctl/rc" ]; then
  rc=$(cat "$ctl/rc")
  exit "$rc"
fi
show_log
die "the VM stopped before COMMAND finished (qemu status $qrc, accel $accel)"
