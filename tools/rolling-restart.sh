#!/usr/bin/env bash
# Restarts every memory server of a mount one after another, each back and confirmed (it
# answers, as a new process) before the next.
#
# A server without a backing file is drained first (its copies moved to the others, every
# chunk at its full count throughout), removed, restarted and added again; a rebalance evens
# the servers out at the end: no degraded second, but every copy moves twice.
# A backed server (`serve --backing`) is restarted in place: it comes back with every extent,
# the mount resumes its session, and only chunks written while it was away are copied (they
# have one copy fewer for those seconds). --drain drains backed servers too.
#
#   tools/rolling-restart.sh MOUNTPOINT COMMAND [--secret-file PATH] [--wait SECONDS] [--drain]
#
# COMMAND restarts one server; `{}` in it is replaced with the server's HOST:PORT, e.g.
#   tools/rolling-restart.sh /mnt/pool 'ssh {} systemctl restart rmemfs-serve'
#   tools/rolling-restart.sh /mnt/pool 'systemctl restart rmemfs-serve@$(echo {} | cut -d: -f2)'
#
# Needs one server more than the mount's copy count, and room for a server's copies on the
# others (the drain refuses otherwise, and this stops there, every server still serving).
# The secret file (also $RMEMFS_SECRET_FILE) is the servers' one, to confirm each restart.
# Environment: RMEMFS_BIN (default: rmemfs on PATH, else target/release/rmemfs).
set -euo pipefail

usage() {
  sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
[ $# -ge 2 ] || usage
MNT=$1 COMMAND=$2
shift 2
WAIT=60
DRAIN=0
SECRET=${RMEMFS_SECRET_FILE:-}
while [ $# -gt 0 ]; do
  case $1 in
    --secret-file) SECRET=$2; shift 2 ;;
    --wait) WAIT=$2; shift 2 ;;
    --drain) DRAIN=1; shift ;;
    *) usage ;;
  esac
done
if [ -n "${RMEMFS_BIN:-}" ]; then
  BIN=$RMEMFS_BIN
elif command -v rmemfs >/dev/null; then
  BIN=$(command -v rmemfs)
else
  BIN=$(cd "$(dirname "$0")/.." && pwd)/target/release/rmemfs
fi
SECRET_ARGS=()
[ -z "$SECRET" ] || SECRET_ARGS=(--secret-file "$SECRET")

say() { echo "rolling-restart: $*" >&2; }

# The mount's servers that are up or draining, in its order.
mapfile -t SERVERS < <("$BIN" stats --json "$MNT" | python3 -c 'import json, sys
for s in json.load(sys.stdin)["servers"]:
    if s["state"] in ("up", "draining"):
        print(s["addr"])')
[ ${#SERVERS[@]} -gt 0 ] || { say "$MNT lists no live server"; exit 1; }
say "${#SERVERS[@]} servers: ${SERVERS[*]}"

# instance ADDR: the server's instance id (empty if it does not answer).
instance() {
  timeout -k 2 10 "$BIN" stats --server "$1" "${SECRET_ARGS[@]}" --json 2>/dev/null |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["instance"])' 2>/dev/null || true
}

# backed ADDR: whether the server keeps its extents in a file (`serve --backing`).
backed() {
  timeout -k 2 10 "$BIN" stats --server "$1" "${SECRET_ARGS[@]}" --json 2>/dev/null |
    python3 -c 'import json, sys; sys.exit(0 if json.load(sys.stdin).get("backed") else 1)'
}

# mount_figure PYTHON-EXPR: a figure of the mount's `stats --json` (as `s`).
mount_figure() {
  "$BIN" stats --json "$MNT" | python3 -c "import json, sys; s = json.load(sys.stdin); print($1)"
}

# wait_new ADDR BEFORE: waits until the server answers as a new process; prints its instance.
wait_new() {
  local now=""
  for ((k = 0; k < WAIT * 2; k++)); do
    now=$(instance "$1")
    [ -n "$now" ] && [ "$now" != "$2" ] && break
    sleep 0.5
  done
  [ -n "$now" ] && [ "$now" != "$2" ] && echo "$now"
}

# wait_whole ADDR: waits until the mount has the server up and every chunk at its count.
wait_whole() {
  for ((k = 0; k < WAIT * 2; k++)); do
    mount_figure "next(x['state'] for x in s['servers'] if x['addr'] == '$1') == 'up' and s['chunks']['degraded'] == 0 and s['chunks']['lost'] == 0" |
      grep -q True && return 0
    sleep 0.5
  done
  return 1
}

drained=0
for addr in "${SERVERS[@]}"; do
  before=$(instance "$addr")
  [ -n "$before" ] || { say "$addr does not answer: fix it first (nothing was changed)"; exit 1; }
  if [ "$DRAIN" = 0 ] && backed "$addr"; then
    copied=$(mount_figure "s['rebuild']['chunks_rebuilt'] + s['rebuild']['chunks_copied_on_write']")
    say "$addr: backed; restarting in place"
    sh -c "${COMMAND//\{\}/$addr}"
    now=$(wait_new "$addr" "$before") || {
      say "$addr did not come back as a new process within $WAIT s: stopping here"
      exit 1
    }
    wait_whole "$addr" || {
      say "$addr: back (instance $now), but the mount has not every chunk at its count after $WAIT s: stopping here"
      exit 1
    }
    copied=$(($(mount_figure "s['rebuild']['chunks_rebuilt'] + s['rebuild']['chunks_copied_on_write']") - copied))
    say "$addr: back (instance $before -> $now) with its extents; $copied chunks written while it was away copied again"
    continue
  fi
  drained=1
  say "$addr: draining"
  "$BIN" admin drain "$MNT" "$addr" >&2
  "$BIN" admin remove "$MNT" "$addr" >&2
  say "$addr: restarting"
  sh -c "${COMMAND//\{\}/$addr}"
  now=$(wait_new "$addr" "$before") || {
    say "$addr did not come back as a new process within $WAIT s: stopping here (it is out of the mount; \`rmemfs admin add-server $MNT $addr\` once it is back)"
    exit 1
  }
  say "$addr: back (instance $before -> $now); adding it again"
  "$BIN" admin add-server "$MNT" "$addr" >&2
done
if [ "$drained" = 1 ]; then
  say "rebalancing"
  "$BIN" admin rebalance "$MNT" >&2
fi
say "done: every server restarted"
