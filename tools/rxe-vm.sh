#!/usr/bin/env bash
# Runs a command inside a throw-away VM that has real soft-RoCE (rdma_rxe on lo as rxe0).
#
#   tools/rxe-vm.sh [--timeout SECONDS] [--mem 2G] [--cpus 2] -- COMMAND...
#
# Why a VM: the host kernel of our machines has no RDMA and no modules, and its /dev/kvm only
# runs PVM guests. Debian's own kernel under qemu's TCG emulator, with the host's root file
# system shared in by virtme-ng, loads rdma_rxe (see ../shared/notes/rxe-vm.md). The project
# directory is read-write in the guest (build on the host, run inside: compiling in TCG is 5 to
# 10 times slower); /tmp, /etc, /usr, /var and $HOME are throw-away overlays.
#
# One argument is run as a shell script (`-- 'cmd1 && cmd2'`), several as a command.
# The command runs as root in the project directory with RMEMFS_RXE_DEVICE=rxe0 and
# `ulimit -l unlimited`. Its exit status is this script's; 124 means the VM timed out.
# Works without a TTY and with stdin closed; qemu never outlives the script.
set -euo pipefail

TIMEOUT=900
MEM=2G
CPUS=2
while [[ $# -gt 0 ]]; do
    case "$1" in
        --timeout) TIMEOUT=$2; shift 2 ;;
        --mem) MEM=$2; shift 2 ;;
        --cpus) CPUS=$2; shift 2 ;;
        --) shift; break ;;
        *) break ;;
    esac
done
if [[ $# -eq 0 ]]; then
    echo "usage: $0 [--timeout S] [--mem 2G] [--cpus 2] -- COMMAND..." >&2
    exit 2
fi

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${RMEMFS_VNG_VENV:-/opt/vng-venv}
VNG_VERSION=1.42
log() { echo "rxe-vm: $*" >&2; }

# --- packages -------------------------------------------------------------------------------
need_pkgs=()
for pair in qemu-system-x86_64:qemu-system-x86 ibv_devices:ibverbs-utils rdma:iproute2 \
    ib_read_bw:perftest fio:fio modprobe:kmod fusermount3:fuse3; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || need_pkgs+=("${pair#*:}")
done
# virtme-ng's guest init needs a static busybox.
[[ -e /bin/busybox ]] && file -L /bin/busybox 2>/dev/null | grep -q static || need_pkgs+=(busybox-static file)
[[ -e /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so ]] || need_pkgs+=(ibverbs-providers rdma-core)
python3 -c 'import venv, ensurepip' 2>/dev/null || need_pkgs+=(python3-venv)
if ! ls /boot/vmlinuz-*-amd64 >/dev/null 2>&1; then need_pkgs+=(linux-image-amd64); fi
if [[ ${#need_pkgs[@]} -gt 0 ]]; then
    log "installing ${need_pkgs[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=900 update -qq >/dev/null
    apt-get install -o DPkg::Lock::Timeout=900 -y -qq "${need_pkgs[@]}" >/dev/null
fi
if [[ ! -x $VENV/bin/vng ]]; then
    log "installing virtme-ng $VNG_VERSION in $VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q "virtme-ng==$VNG_VERSION"
fi
export PATH=$VENV/bin:$PATH # vng finds its helper virtme-run on PATH

KERNEL=$(ls -1 /boot/vmlinuz-*-amd64 | sort -V | tail -1)
MODDIR=/lib/modules/${KERNEL#/boot/vmlinuz-}
[[ -e $MODDIR/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko || -n $(find "$MODDIR" -name 'rdma_rxe.ko*' -print -quit) ]] ||
    { log "$KERNEL has no rdma_rxe module under $MODDIR"; exit 1; }

# --- the guest side -------------------------------------------------------------------------
WORK=$(mktemp -d "$ROOT/target/rxe-vm.XXXXXX" 2>/dev/null || { mkdir -p "$ROOT/target" && mktemp -d "$ROOT/target/rxe-vm.XXXXXX"; })
QEMU_PGID=
cleanup() {
    if [[ -n $QEMU_PGID ]]; then
        kill -TERM -- "-$QEMU_PGID" 2>/dev/null || true
        sleep 1
        kill -KILL -- "-$QEMU_PGID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# One argument is a shell script; several are a command and its arguments.
if [[ $# -eq 1 ]]; then printf '%s\n' "$1" >"$WORK/cmd"; else printf '%q ' "$@" >"$WORK/cmd"; fi
cat >"$WORK/guest.sh" <<'GUEST'
set -u
work=$1
status_file=$work/status
echo 255 >"$status_file"
for m in rdma_rxe ib_uverbs rdma_ucm fuse; do
    modprobe "$m" || { echo "guest: modprobe $m failed" >&2; exit 1; }
done
ip link set lo up
rdma link add rxe0 type rxe netdev lo || { echo "guest: rdma link add failed" >&2; exit 1; }
for _ in $(seq 100); do [ -e /dev/infiniband/uverbs0 ] && break; sleep 0.1; done
[ -e /dev/infiniband/uverbs0 ] || { echo "guest: /dev/infiniband/uverbs0 never appeared" >&2; exit 1; }
ulimit -l unlimited
export RMEMFS_RXE_DEVICE=rxe0 RMEMFS_IN_RXE_VM=1
cd "$RMEMFS_ROOT"
bash -c "$(cat "$work/cmd")" </dev/null
rc=$?
echo $rc >"$status_file"
sync
exit $rc
GUEST

# qemu re-opens /proc/self/fd/1 and 2: regular files get truncated, so hand it FIFOs.
mkfifo "$WORK/out" "$WORK/err"
cat <"$WORK/out" &
CAT_OUT=$!
cat <"$WORK/err" >&2 &
CAT_ERR=$!

log "booting $(basename "$KERNEL") under TCG (${MEM}, ${CPUS} CPUs, timeout ${TIMEOUT}s)"
START=$(date +%s)
set +e
setsid timeout --kill-after=10 "$TIMEOUT" \
    env RMEMFS_ROOT="$ROOT" vng -r "$KERNEL" --disable-kvm -m "$MEM" -p "$CPUS" \
    --qemu-opts='-accel tcg,thread=multi,tb-size=512' \
    --rwdir="$ROOT" --cwd "$ROOT" --overlay-rwdir="$HOME" \
    --exec "RMEMFS_ROOT=$ROOT bash $WORK/guest.sh $WORK" \
    </dev/null >"$WORK/out" 2>"$WORK/err" &
VNG_PID=$!
QEMU_PGID=$VNG_PID
wait $VNG_PID
VNG_RC=$?
set -e
wait $CAT_OUT $CAT_ERR 2>/dev/null || true
STATUS=$(cat "$WORK/status" 2>/dev/null || echo)
log "VM finished after $(($(date +%s) - START)) s (vng status $VNG_RC, command status ${STATUS:-none})"
if [[ $VNG_RC -eq 124 || $VNG_RC -eq 137 ]]; then
    log "timed out after ${TIMEOUT}s"
    exit 124
fi
if [[ -z $STATUS || $STATUS == 255 ]]; then
    log "the command did not run to completion in the guest"
    exit 1
fi
exit "$STATUS"
