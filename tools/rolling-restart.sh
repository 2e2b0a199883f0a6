#!/usr/bin/env bash
# Restarts every memory server of a mount one after another without a degraded second: each
# server is drained (its copies moved to the others, every chunk at its full count
# throughout), removed, restarted by COMMAND, confirmed back (it answers, as a new process),
# and added again; a rebalance evens the servers out at the end.
#
#   tools/rolling-restart.sh MOUNTPOINT COMMAND [--secret-file PATH] [--wait SECONDS]
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
  sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
[ $# -ge 2 ] || usage
MNT=$1 COMMAND=$2
shift 2
WAIT=60
SECRET=${RMEMFS_SECRET_FILE:-}
while [ $# -gt 0 ]; do
  case $1 in
    --secret-file) SECRET=$2; shift 2 ;;
    --wait) WAIT=$2; shift 2 ;;
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

for addr in "${SERVERS[@]}"; do
  before=$(instance "$addr")
  [ -n "$before" ] || { say "$addr does not answer: fix it first (nothing was changed)"; exit 1; }
  say "$addr: draining"
  "$BIN" admin drain "$MNT" "$addr" >&2
  "$BIN" admin remove "$MNT" "$addr" >&2
  say "$addr: restarting"
  sh -c "${COMMAND//\{\}/$addr}"
  now=""
  for ((k = 0; k < WAIT * 2; k++)); do
    now=$(instance "$addr")
    [ -n "$now" ] && [ "$now" != "$before" ] && break
    sleep 0.5
  done
  if [ -z "$now" ] || [ "$now" = "$before" ]; then
    say "$addr did not come back as a new process within $WAIT s: stopping here (it is out of the mount; \`rmemfs admin add-server $MNT $addr\` once it is back)"
    exit 1
  fi
  say "$addr: back (instance $before -> $now); adding it again"
  "$BIN" admin add-server "$MNT" "$addr" >&2
done
say "rebalancing"
"$BIN" admin rebalance "$MNT" >&2
say "done: every server restarted, none degraded"
