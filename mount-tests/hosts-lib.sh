# shellcheck shell=bash
# Test hosts for failure tests (mount-tests/hosts.sh, tools/chaos.sh): memory servers on
# separate network hosts, each a network namespace this harness creates with its own address
# on a veth pair whose root end sits on a bridge; the mount runs in the root namespace. A host
# can be killed, frozen (SIGSTOP/SIGCONT), restarted (same address, a new process with an empty
# arena) and cut off (its link down) and healed. Everything is torn down on exit. Only these
# addresses (HOSTS_NET below) and loopback are ever used. Sourced after lib.sh and lib_init.

# A private /24 of our choosing: the bridge is .1, host i is .(10+i).
HOSTS_NET=${RMEMFS_HOSTS_NET:-10.213.7}
HOSTS_PORT=7471
# Names of the bridge, namespaces and links start with this tag; two runs side by side need
# different tags (and networks).
HOSTS_TAG=${RMEMFS_HOSTS_TAG:-rm}
HOSTS_BRIDGE=${HOSTS_TAG}br0
HOST_PIDS=()   # the memory server of host i (empty while it is down)
HOST_ARGS=()   # how host i's server was started (size and extra arguments), for restarts
HOSTS_N=0
HOSTS_SECRET=""

host_ns() { echo "${HOSTS_TAG}h$1"; }
host_link() { echo "${HOSTS_TAG}v$1"; }
host_ip() { echo "$HOSTS_NET.$((10 + $1))"; }
host_addr() { echo "$(host_ip "$1"):$HOSTS_PORT"; }

# hosts_addrs: the server address of every host that runs one (the first HOSTS_SERVERS,
# default all), comma separated (for --servers).
hosts_addrs() {
  local i out=""
  for ((i = 0; i < ${HOSTS_SERVERS:-$HOSTS_N}; i++)); do out+=${out:+,}$(host_addr "$i"); done
  echo "$out"
}

# hosts_teardown: stops every host's server and removes namespaces, links and the bridge.
hosts_teardown() {
  local i
  set +e
  for ((i = 0; i < HOSTS_N; i++)); do
    if [ -n "${HOST_PIDS[i]:-}" ]; then
      kill -CONT "${HOST_PIDS[i]}" 2>/dev/null
      kill -KILL "${HOST_PIDS[i]}" 2>/dev/null
    fi
  done
  # Every host a run may make (chaos's e42 phase makes eight), leftovers of another run too.
  for ((i = 0; i < (HOSTS_N > 8 ? HOSTS_N : 8); i++)); do
    ip netns pids "$(host_ns "$i")" 2>/dev/null | xargs -r kill -KILL 2>/dev/null
    ip link del "$(host_link "$i")" 2>/dev/null
    ip netns del "$(host_ns "$i")" 2>/dev/null
  done
  ip link del "$HOSTS_BRIDGE" 2>/dev/null
  HOSTS_N=0
  return 0
}

# hosts_init N: creates N test hosts on a bridge (removing leftovers of an earlier run first)
# and a shared secret for their servers and the mount. Installs the teardown in the EXIT trap.
hosts_init() {
  local i ns link
  command -v ip >/dev/null 2>&1 || ensure_packages ip:iproute2
  HOSTS_N=6 hosts_teardown
  trap 'hosts_teardown; cleanup' EXIT
  ip link add "$HOSTS_BRIDGE" type bridge || return 1
  ip addr add "$HOSTS_NET.1/24" dev "$HOSTS_BRIDGE"
  ip link set "$HOSTS_BRIDGE" up
  HOSTS_N=$1
  for ((i = 0; i < HOSTS_N; i++)); do
    ns=$(host_ns "$i") link=$(host_link "$i")
    ip netns add "$ns" || return 1
    ip link add "$link" type veth peer name eth0 netns "$ns" || return 1
    ip link set "$link" master "$HOSTS_BRIDGE"
    ip link set "$link" up
    ip -n "$ns" addr add "$(host_ip "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    HOST_PIDS[i]=""
  done
  HOSTS_SECRET=$BASE/secret
  "$BIN" keygen --force "$HOSTS_SECRET" >/dev/null
}

# host_start I SIZE [ARGS...]: starts host I's memory server (authenticated) and waits for it
# to listen. ARGS are kept for host_restart.
host_start() {
  local i=$1 size=$2 out err k
  shift 2
  HOST_ARGS[i]="$size $*"
  out=$BASE/logs/host$i-$RANDOM.out
  err=${out%.out}.err
  # nsenter joins only the host's network namespace: `ip netns exec` would also give the
  # server a mount namespace holding a copy of the test's FUSE mount, which would then
  # outlive its umount.
  nsenter --net="/run/netns/$(host_ns "$i")" "$BIN" serve --listen "$(host_addr "$i")" --size "$size" \
    --secret-file "$HOSTS_SECRET" "$@" >"$out" 2>"$err" </dev/null &
  HOST_PIDS[i]=$!
  disown "${HOST_PIDS[i]}"
  for ((k = 0; k < 100; k++)); do
    grep -q "listening on" "$out" 2>/dev/null && return 0
    if ! kill -0 "${HOST_PIDS[i]}" 2>/dev/null; then
      # A killed predecessor's port may take a moment to be released.
      if grep -q "Address already in use" "$err" && [ "${HOST_RETRY:-0}" -lt 50 ]; then
        sleep 0.1
        HOST_RETRY=$((${HOST_RETRY:-0} + 1)) host_start "$i" "$size" "$@"
        return
      fi
      echo "host $i's server exited at startup: $(tail -n 3 "$err" | tr '\n' ' ')" >&2
      return 1
    fi
    sleep 0.1
  done
  echo "host $i's server did not listen within 10 s" >&2
  return 1
}

# host_kill I: SIGKILL to host I's server (a crash: its memory is gone). Returns once every
# thread of the process has exited (gone, or a zombie with its last thread gone), so nothing
# of it serves a request after this returns and its port is free for a restart. (The main
# thread of a killed process shows as a zombie while its other threads, which hold the
# sockets, may still be exiting: a run once counted a write those threads served after the
# zombie showed as acknowledged by a server already dead.)
host_kill() {
  local pid=${HOST_PIDS[$1]} k
  HOST_PIDS[$1]=""
  [ -n "$pid" ] || return 0
  kill -CONT "$pid" 2>/dev/null || true
  kill -KILL "$pid" 2>/dev/null || true
  for ((k = 0; k < 200; k++)); do
    [ -e "/proc/$pid" ] || return 0
    if grep -q '^State:[[:space:]]*Z' "/proc/$pid/status" 2>/dev/null &&
      [ "$(find "/proc/$pid/task" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)" -le 1 ]; then
      return 0
    fi
    sleep 0.05
  done
  echo "host $1's server (pid $pid) has threads left 10 s after SIGKILL" >&2
  return 1
}

# host_restart I: a killed host's server starts again: same address, a new empty arena.
host_restart() {
  local args
  read -ra args <<<"${HOST_ARGS[$1]}"
  host_start "$1" "${args[@]}"
}

host_freeze() { kill -STOP "${HOST_PIDS[$1]}"; }
host_thaw() { kill -CONT "${HOST_PIDS[$1]}"; }
host_cut() { ip link set "$(host_link "$1")" down; }
host_heal() { ip link set "$(host_link "$1")" up; }


# wait_redundant MNT SECONDS [any]: waits until `stats --json` shows every server up or removed (with
# `any`: whatever their state) and every chunk with its full copy count (none degraded or
# lost); fails with the figures otherwise. Read from the JSON report by key, so a renamed or
# missing field fails instead of matching nothing.
wait_redundant() {
  local mnt=$1 secs=$2 servers=${3:-up} st k
  for ((k = 0; k < secs * 2; k++)); do
    st=$(stats_field "$mnt" "'%d %d %d %d' % (
        sum(x['state'] not in ('up', 'removed') for x in s['servers']), len(s['servers']),
        s['chunks']['degraded'], s['chunks']['lost'])") || fail "rmemfs stats --json failed"
    read -r notup total degraded lost <<<"$st"
    [ "$total" -gt 0 ] || fail "stats lists no server"
    if { [ "$servers" = any ] || [ "$notup" -eq 0 ]; } && [ "$degraded" -eq 0 ] && [ "$lost" -eq 0 ]; then
      return 0
    fi
    sleep 0.5
  done
  fail "not back to full redundancy within $secs s: servers not up $notup of $total, chunks degraded $degraded, lost $lost"
}
