# shellcheck shell=bash disable=SC2016 # '$1' in bash -c scripts is meant literally
# Helpers for the real-mount tests (mount-tests/run.sh) and the fio benchmark
# (lab/scripts/bench-fio.sh, through lab/scripts/lib.sh): installing tools, starting memory servers, mounting and unmounting,
# cleanup, and assertions. Sourced from the repository root; defines functions and settings only.
# Call lib_init before anything else.

BIN=${RMEMFS_BIN:-target/release/rmemfs}
BIN_NAME=${BIN##*/}
# The lab's benchmark binary (lab/, `cargo build --release --workspace`), next to BIN unless
# RMEMFS_BENCH_BIN says otherwise. The benchmark scripts run it with `--rmemfs "$BIN"`.
BENCH_BIN=${RMEMFS_BENCH_BIN:-$(dirname "$BIN")/rmemfs-bench}
# Default limit (seconds) for any command that touches the mount: a hang becomes a failure.
TMO=${RMEMFS_TEST_TIMEOUT:-120}
# Extra arguments for every `rmemfs mount` (e.g. "--chunk-size 1M").
read -ra MOUNT_ARGS <<<"${RMEMFS_MOUNT_ARGS:-}"
# Extra arguments for every `rmemfs serve` (e.g. "--fabric verbs" in the rxe VM).
read -ra SERVE_ARGS <<<"${RMEMFS_SERVE_ARGS:-}"
# When set, every mount must report this fabric in `rmemfs stats` (mounts take the fabric the
# servers announce, so this proves the run used it).
EXPECT_FABRIC=${RMEMFS_EXPECT_FABRIC:-}
# Likewise the way requests reach the daemon ("io_uring" or "/dev/fuse"): an -o io_uring run
# that fell back to /dev/fuse would test nothing new.
EXPECT_FUSE=${RMEMFS_EXPECT_FUSE:-}
# Error messages (strerror) must be English for the ENOSPC / EIO checks, and sorting bytewise.
export LC_ALL=C

BASE=""             # the mktemp -d base; everything this run creates lives under it
ALL_SERVER_PIDS=()  # every memory server started, for cleanup
SERVER_SEQ=0
SERVER_ADDR=""      # set by start_server
SERVER_PID=""       # set by start_server
REASON=/dev/null    # where fail() writes the reason (run.sh points it at a per-test file)

# lib_init NAME: creates the base directory and installs the cleanup traps.
lib_init() {
  # Resolved, so that paths match the kernel's mount table.
  BASE=$(realpath "$(mktemp -d "${TMPDIR:-/tmp}/rmemfs-$1.XXXXXX")")
  mkdir -p "$BASE/logs"
  trap cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
}

log() { printf '# %s\n' "$*" >&2; }

# ensure_packages CMD:PACKAGE...: installs (apt, Debian) the packages whose command is missing.
ensure_packages() {
  local pair cmd pkg need=()
  for pair in "$@"; do
    cmd=${pair%%:*} pkg=${pair#*:}
    if ! command -v "$cmd" >/dev/null 2>&1; then
      case " ${need[*]} " in *" $pkg "*) ;; *) need+=("$pkg") ;; esac
    fi
  done
  [ ${#need[@]} -eq 0 ] && return 0
  log "installing: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  timeout 600 apt-get -o DPkg::Lock::Timeout=900 update -qq
  # Another tier may be installing at the same moment (test.sh overlaps some): wait for it.
  timeout 1200 apt-get install -o DPkg::Lock::Timeout=900 -y -qq "${need[@]}" >/dev/null
}

# check_prereqs: root, /dev/fuse, and a binary that has the subcommands we need.
check_prereqs() {
  local sub
  if [ "$(id -u)" -ne 0 ]; then
    echo "error: these tests mount file systems and must run as root" >&2
    return 1
  fi
  if [ ! -c /dev/fuse ]; then
    echo "error: /dev/fuse is missing (load the fuse module or run the container with it)" >&2
    return 1
  fi
  if [ ! -x "$BIN" ]; then
    echo "error: $BIN not found: build it with 'cargo build --release' (or set RMEMFS_BIN)" >&2
    return 1
  fi
  for sub in "$@"; do
    if ! timeout 30 "$BIN" "$sub" --help >/dev/null 2>&1; then
      echo "error: $BIN has no '$sub' subcommand" >&2
      return 1
    fi
  done
}

# has_fuse_uring: whether this kernel has FUSE over io_uring (the fuse module's switch exists).
has_fuse_uring() { [ -e /sys/module/fuse/parameters/enable_uring ]; }

# --- memory servers --------------------------------------------------------------------------

# parse_addr LINE: prints the first whitespace-separated word that looks like IPv4:PORT.
parse_addr() {
  local w words
  read -ra words <<<"$1"
  for w in "${words[@]}"; do
    if [[ $w =~ ^[0-9]{1,3}(\.[0-9]{1,3}){3}:[0-9]{1,5}$ ]]; then
      printf '%s\n' "$w"
      return 0
    fi
  done
  return 1
}

# start_server SIZE: starts `rmemfs serve` on an ephemeral loopback port in the background and
# waits (10 s at most) for its "listening on ADDR" line. Sets SERVER_ADDR and SERVER_PID.
start_server() {
  local size=$1 out err line i
  shift
  SERVER_SEQ=$((SERVER_SEQ + 1))
  # The shell's PID too: a test's subshell counts from the parent's number, and a stale
  # file's first line must never pass for this server's address.
  out=$BASE/logs/server-$SERVER_SEQ-$BASHPID.out
  err=$BASE/logs/server-$SERVER_SEQ-$BASHPID.err
  rm -f "$out" "$err"
  SERVER_LOG=$err
  "$BIN" serve --listen 127.0.0.1:0 --size "$size" "${SERVE_ARGS[@]}" "$@" >"$out" 2>"$err" \
    </dev/null &
  SERVER_PID=$!
  # Out of the job table: bash then reports nothing when a test kills it with SIGKILL.
  disown "$SERVER_PID"
  ALL_SERVER_PIDS+=("$SERVER_PID")
  SERVER_ADDR=""
  # A reserved arena is faulted in before the server listens: about 1.5 s per GiB here.
  for ((i = 0; i < 600; i++)); do
    # `read` fails on a partial line (no newline yet): only parse a complete first line.
    # shellcheck disable=SC2034 # SERVER_ADDR is read by the callers
    if [ -s "$out" ] && IFS= read -r line <"$out" && SERVER_ADDR=$(parse_addr "$line"); then
      return 0
    fi
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      echo "memory server ($size) exited at startup: $(tail -n 3 "$err" | tr '\n' ' ')" >&2
      return 1
    fi
    sleep 0.1
  done
  echo "memory server ($size) printed no 'listening on ADDR' line within 60 s" >&2
  kill_servers "$SERVER_PID"
  return 1
}

# is_our_server PID: the process is alive and is an `rmemfs serve` we started.
is_our_server() {
  { tr '\0' ' ' <"/proc/$1/cmdline"; } 2>/dev/null | grep -q " serve --listen 127.0.0.1:0 "
}

# kill_servers PID...: stops the given memory servers (TERM, then KILL after 5 s).
kill_servers() {
  local pid i
  for pid in "$@"; do
    is_our_server "$pid" && kill -TERM "$pid" 2>/dev/null
  done
  for pid in "$@"; do
    for ((i = 0; i < 50; i++)); do
      is_our_server "$pid" || break
      sleep 0.1
    done
    is_our_server "$pid" && kill -KILL "$pid" 2>/dev/null
  done
  return 0
}

# --- mounts ----------------------------------------------------------------------------------

# is_mounted DIR: DIR is in the mount table (reads /proc, never touches the mount itself).
is_mounted() {
  awk -v m="$1" '$2 == m { found = 1 } END { exit !found }' /proc/self/mounts
}

re_escape() { printf '%s' "$1" | sed 's/[][\.*^$+?(){}|/]/\\&/g'; }

# daemon_pids MNT: PIDs of processes whose command line contains "rmemfs mount MNT".
daemon_pids() {
  pgrep -f "${BIN_NAME} mount $(re_escape "$1")( |\$)" || true
}

# wait_daemon_gone MNT SECONDS: waits until no daemon for MNT remains and the mount point,
# if still mounted, answers that its connection is gone (ENOTCONN).
wait_daemon_gone() {
  local i out
  for ((i = 0; i < $2 * 5; i++)); do
    if [ -z "$(daemon_pids "$1")" ]; then
      # The kernel ends the FUSE connection a moment after the process (longer on a slow
      # VM): until the mount point says so, a new mount there takes it for a live one.
      is_mounted "$1" || return 0
      out=$(timeout -k 1 2 stat "$1" 2>&1 >/dev/null) || true
      grep -qiE "not connected|aborted" <<<"$out" && return 0
    fi
    sleep 0.2
  done
  return 1
}

# start_redis: a redis-server of the test's own on a free loopback port (REDIS_BIND: on that
# address instead, the test hosts' bridge), installed if missing, stopped when the test ends
# (an EXIT trap; with `--own-trap` the caller's trap stops REDIS_PID); REDIS_URL says where.
start_redis() {
  local port i bind=${REDIS_BIND:-127.0.0.1}
  command -v redis-server >/dev/null 2>&1 || ensure_packages redis-server:redis-server
  port=$(python3 -c 'import socket,sys; s=socket.socket(); s.bind((sys.argv[1],0)); print(s.getsockname()[1])' "$bind")
  # Off loopback Redis refuses clients without a password (protected mode): the bridge is
  # the test's own network.
  redis-server --port "$port" --bind "$bind" --save "" --appendonly no --protected-mode no \
    >"${WORK:-$BASE}/redis.log" 2>&1 &
  REDIS_PID=$!
  # shellcheck disable=SC2064 # the pid is meant to be expanded now
  [ "${1:-}" = --own-trap ] || trap "kill $REDIS_PID 2>/dev/null || true" EXIT
  for ((i = 0; i < 100; i++)); do
    python3 -c 'import socket,sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 1)' "$bind" "$port" 2>/dev/null && break
    sleep 0.05
  done
  REDIS_URL=redis://$bind:$port
}

# mount_fs MNT ADDRS [ARGS...]: `rmemfs mount MNT --servers ADDRS` (daemonizes). Its output
# goes to logs/mount-*.log; on failure the last lines are printed on stderr. MOUNT_NETNS=NS
# runs the daemon in network namespace NS (a test host of hosts-lib.sh) and only there: the
# mount itself stays in the test's mount namespace.
mount_fs() {
  local mnt=$1 addrs=$2 rc=0 mlog vol=() netns=()
  shift 2
  [ -n "${MOUNT_NETNS:-}" ] && netns=(nsenter --net="/run/netns/$MOUNT_NETNS")
  mkdir -p "$mnt"
  mlog=$BASE/logs/mount-${mnt##*/}.log
  # RMEMFS_TEST_VOLUME=1: every mount is a new volume of its own, removed at unmount (the
  # data-path tests again on volumes).
  if [ "${RMEMFS_TEST_VOLUME:-0}" = 1 ]; then
    vol=(--volume "t${mnt##*/}-$RANDOM" --create)
    printf '%s %s %s\n' "$mnt" "$addrs" "${vol[1]}" >>"$BASE/volumes"
  fi
  timeout -k 10 60 "${netns[@]}" "$BIN" mount "$mnt" --servers "$addrs" "${MOUNT_ARGS[@]}" "${vol[@]}" "$@" \
    >"$mlog" 2>&1 </dev/null || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "rmemfs mount $mnt failed (exit $rc): $(tail -n 3 "$mlog" | tr '\n' ' ')" >&2
    return 1
  fi
  if ! is_mounted "$mnt"; then
    echo "rmemfs mount returned 0 but $mnt is not in the mount table" >&2
    return 1
  fi
  if [ -n "$EXPECT_FABRIC" ] &&
    ! timeout -k 5 30 "$BIN" stats "$mnt" 2>&1 | grep -qx "fabric: $EXPECT_FABRIC"; then
    echo "$mnt does not run on the $EXPECT_FABRIC fabric: $("$BIN" stats "$mnt" 2>&1 | grep fabric)" >&2
    return 1
  fi
  if [ -n "$EXPECT_FUSE" ] &&
    ! timeout -k 5 30 "$BIN" stats "$mnt" 2>&1 | grep -qx "fuse: $EXPECT_FUSE"; then
    echo "$mnt is not served through $EXPECT_FUSE: $("$BIN" stats "$mnt" 2>&1 | grep '^fuse')" >&2
    return 1
  fi
}

# unmount_fs MNT: umount (30 s), then the daemon must exit within 10 s. Falls back to
# `umount -l` and returns 1 when the clean unmount fails.
unmount_fs() {
  local mnt=$1
  if is_mounted "$mnt"; then
    if ! timeout -k 5 30 umount "$mnt"; then
      echo "umount $mnt failed; detaching it lazily" >&2
      timeout -k 5 10 umount -l "$mnt" || true
      return 1
    fi
  fi
  if ! wait_daemon_gone "$mnt" 10; then
    echo "the daemon for $mnt is still running 10 s after umount: $(daemon_pids "$mnt" | tr '\n' ' ')" >&2
    return 1
  fi
  remove_test_volumes "$mnt"
}

# remove_test_volumes MNT: `volume rm` of the volumes RMEMFS_TEST_VOLUME made for MNT.
remove_test_volumes() {
  local m a v
  [ -s "$BASE/volumes" ] || return 0
  while read -r m a v; do
    [ "$m" = "$1" ] || continue
    timeout -k 5 60 "$BIN" volume rm "$v" --servers "$a" >/dev/null ||
      echo "volume rm $v failed" >&2
  done <"$BASE/volumes"
  grep -v "^$1 " "$BASE/volumes" >"$BASE/volumes.left" || true
  mv "$BASE/volumes.left" "$BASE/volumes"
}

# drop_caches MNT: flushes MNT's dirty pages and drops the kernel's clean caches, so the next
# read goes to the daemon (and so to the memory servers) instead of the page cache. Fails
# (saying why) when the caches cannot be dropped: a "read back from the servers" check would
# otherwise read the page cache and pass without testing its claim.
drop_caches() {
  timeout -k 5 60 sync -f "$1" || { echo "sync -f $1 failed" >&2; return 1; }
  if ! timeout -k 5 60 sh -c 'echo 3 >/proc/sys/vm/drop_caches' 2>/dev/null; then
    echo "cannot write /proc/sys/vm/drop_caches: reads would come from the page cache" >&2
    return 1
  fi
}

# cleanup: unmounts everything under BASE, stops the daemons and servers, removes BASE.
# RMEMFS_TEST_KEEP=1 keeps BASE (logs) for inspection.
cleanup() {
  local m pid i
  set +e
  [ -n "$BASE" ] && [ -d "$BASE" ] || return 0
  while IFS= read -r m; do
    timeout -k 5 30 umount "$m" 2>/dev/null || timeout -k 5 10 umount -l "$m" 2>/dev/null
  done < <(awk -v b="$BASE/" 'index($2, b) == 1 { print $2 }' /proc/self/mounts | sort -r)
  for pid in $(pgrep -f "${BIN_NAME} mount $(re_escape "$BASE")/"); do
    kill -TERM "$pid" 2>/dev/null
  done
  for ((i = 0; i < 25; i++)); do
    [ -z "$(pgrep -f "${BIN_NAME} mount $(re_escape "$BASE")/")" ] && break
    sleep 0.2
  done
  for pid in $(pgrep -f "${BIN_NAME} mount $(re_escape "$BASE")/"); do
    kill -KILL "$pid" 2>/dev/null
  done
  kill_servers "${ALL_SERVER_PIDS[@]}"
  if [ "${RMEMFS_TEST_KEEP:-0}" = 1 ]; then
    log "kept $BASE"
  else
    rm -rf --one-file-system "$BASE"
  fi
  BASE=""
  return 0
}

# --- assertions (for test functions, which run in a subshell) -------------------------------

is_timeout() { [ "$1" -eq 124 ] || [ "$1" -eq 137 ]; }

# fail MSG: records the reason (the first one wins) and ends the test.
fail() {
  [ -s "$REASON" ] || printf '%s\n' "$*" >"$REASON"
  echo "FAILED: $*" >&2
  exit 1
}

# skip REASON: ends the test as skipped (a tool it needs is missing), said loudly and
# counted apart from passes.
skip() {
  printf 'SKIPPED: %s\n' "$*" >"$REASON"
  echo "SKIPPED: $*" >&2
  exit 3
}

# on_err RC WHERE CMD: ERR trap of a test: an unchecked command failed. When it failed inside a
# helper, WHERE becomes the line of the test function that called the helper.
on_err() {
  local i where=$2
  for ((i = 2; i < ${#FUNCNAME[@]}; i++)); do
    if [[ ${FUNCNAME[i]} == test_* ]]; then
      where="${BASH_SOURCE[i]##*/}:${BASH_LINENO[i - 1]} in ${FUNCNAME[1]}"
      break
    fi
  done
  if is_timeout "$1"; then
    [ -s "$REASON" ] || printf 'timed out (%s): %s\n' "$where" "$3" >"$REASON"
  else
    [ -s "$REASON" ] || printf '%s: `%s` exited %s\n' "$where" "$3" "$1" >"$REASON"
  fi
}

# t CMD...: CMD under the default timeout.
t() { timeout -k 10 "$TMO" "$@"; }

# must_within SECS DESC CMD...: CMD must succeed within SECS seconds.
must_within() {
  local secs=$1 desc=$2 rc=0
  shift 2
  timeout -k 10 "$secs" "$@" || rc=$?
  if is_timeout "$rc"; then
    fail "$desc: timed out after ${secs}s ($*)"
  elif [ "$rc" -ne 0 ]; then
    fail "$desc: exit $rc ($*)"
  fi
}

# must DESC CMD...: CMD must succeed within the default timeout.
must() { must_within "$TMO" "$@"; }

# must_fail DESC PATTERN CMD...: CMD must fail (not time out), with PATTERN (grep -E) in its
# stderr unless PATTERN is empty.
must_fail() { must_fail_within "$TMO" "$@"; }

# must_fail_within SECS DESC PATTERN CMD...: as must_fail, within SECS seconds (a promise of
# "at once" or "within the op timeout" checked with its bound).
must_fail_within() {
  local secs=$1 desc=$2 pattern=$3 rc=0 err
  shift 3
  err=$(mktemp "$BASE/logs/err.XXXXXX")
  timeout -k 10 "$secs" "$@" 2>"$err" || rc=$?
  cat "$err" >&2
  if [ "$rc" -eq 0 ]; then
    fail "$desc: succeeded but should have failed ($*)"
  elif is_timeout "$rc"; then
    fail "$desc: not failed within ${secs}s ($*)"
  elif [ -n "$pattern" ] && ! grep -Eq "$pattern" "$err"; then
    fail "$desc: stderr lacks '$pattern': $(head -c 200 "$err" | tr '\n' ' ')"
  fi
}

# assert_eq DESC ACTUAL EXPECTED
assert_eq() {
  [ "$2" = "$3" ] || fail "$1: got '$(printf '%s' "$2" | head -c 200)', expected '$(printf '%s' "$3" | head -c 200)'"
}

# exists PATH: true/false; a hang or an unexpected error fails the test.
exists() {
  local rc=0
  timeout -k 5 30 test -e "$1" || rc=$?
  case $rc in
    0) return 0 ;;
    1) return 1 ;;
    *) fail "test -e $1: exit $rc" ;;
  esac
}

# put FILE TEXT: writes TEXT and a newline to FILE (truncating).
put() { must "write $1" bash -c 'printf "%s\n" "$2" >"$1"' _ "$1" "$2"; }

# get FILE: prints FILE's content.
get() { t cat "$1"; }

# stat_listing DIR: "path mode size type" for DIR and everything in it, sorted, plus the mtime
# of regular files; directories without size (it differs between file systems).
stat_listing() {
  timeout -k 10 "$TMO" bash -c \
    'set -o pipefail; cd "$1" && find . -print0 | sort -z | xargs -0 stat -c "%F|%a|%s|%Y|%n"' _ "$1" |
    awk -F'|' '$1 == "directory" { print $5, $2, $1; next }
               $1 == "regular file" || $1 == "regular empty file" { print $5, $2, $3, $4, $1; next }
               { print $5, $2, $3, $1 }'
}

# compare_trees A B WHAT: diff -r, cmp of every regular file, and equal stat listings.
compare_trees() {
  local a=$1 b=$2 what=$3 f n=0 scratch
  must "$what: diff -r $a $b" diff -r "$a" "$b"
  while IFS= read -r -d '' f; do
    must "$what: cmp $f" cmp "$a/$f" "$b/$f"
    n=$((n + 1))
  done < <(cd "$a" && find . -type f -print0)
  [ "$n" -gt 0 ] || fail "$what: no regular files to compare in $a"
  scratch=$(mktemp -d "$BASE/logs/ls.XXXXXX")
  stat_listing "$a" >"$scratch/a" || fail "$what: stat listing of $a failed"
  stat_listing "$b" >"$scratch/b" || fail "$what: stat listing of $b failed"
  if ! diff "$scratch/a" "$scratch/b" >"$scratch/diff"; then
    cat "$scratch/diff" >&2
    fail "$what: stat listings differ: $(grep '^[<>]' "$scratch/diff" | head -n 2 | tr '\n' ' ')"
  fi
}

# make_src_tree DIR: a tree on local disk: nested directories, 200 files of random sizes
# (0..300 KiB), a 5 MiB file, an empty file, an empty directory, a symlink, names with spaces,
# and a few different modes.
make_src_tree() {
  local d=$1 i size sub
  local dirs=(. a a/b a/b/c a/d e e/f e/f/g e/f/g/h "dir with space")
  for sub in "${dirs[@]}" empty_dir; do mkdir -p "$d/$sub"; done
  # RMEMFS_TEST_TREE_FILES: fewer files where I/O is slow (the rxe VM emulates its CPU).
  for ((i = 0; i < ${RMEMFS_TEST_TREE_FILES:-200}; i++)); do
    size=$(((RANDOM * 32768 + RANDOM) % (300 * 1024 + 1)))
    sub=${dirs[i % ${#dirs[@]}]}
    head -c "$size" /dev/urandom >"$d/$sub/file$i.bin"
  done
  : >"$d/empty"
  echo "a file with spaces in its name" >"$d/a/file with spaces.txt"
  head -c $((5 << 20)) /dev/urandom >"$d/e/big-5MiB.bin"
  ln -s a/b/file2.bin "$d/link-to-file2"
  chmod 600 "$d/file0.bin"
  chmod 755 "$d/a/file1.bin"
  chmod 444 "$d/a/b/file2.bin"
  chmod 700 "$d/a/d"
}

# --- writers and checkers for failure tests (run.sh, hosts.sh) -------------------------------

# write_restart_script FILE SIZE: FILE restarts the test server at HOST:PORT (its first
# argument): the process in $WORK/pid.HOST:PORT gets SIGKILL (or the signal named in
# $WORK/signal) and is waited for, then a new `serve` of SIZE listens on the same port, with
# SERVE_ARGS and the words in $WORK/args.HOST:PORT (if any); it exits once that one listens.
write_restart_script() {
  {
    echo '#!/usr/bin/env bash'
    echo '# Restarts the test server at $1: a signal, then a new process on the same port.'
    echo 'set -u'
    echo "work=$WORK bin=$BIN size=$2"
    printf 'extra=(%s)\n' "${SERVE_ARGS[*]}"
    cat <<'SCRIPT'
pidf=$work/pid.$1 sig=KILL own=()
[ -e "$work/signal" ] && sig=$(cat "$work/signal")
# shellcheck disable=SC2207 # the file holds words
[ -e "$work/args.$1" ] && own=($(cat "$work/args.$1"))
kill -"$sig" "$(cat "$pidf")" 2>/dev/null
for ((j = 0; j < 100; j++)); do kill -0 "$(cat "$pidf")" 2>/dev/null || break; sleep 0.1; done
for ((k = 0; k < 100; k++)); do
  # The last process's "listening" line must not pass for this one's.
  rm -f "$work/serve-$1.out"
  setsid "$bin" serve --listen "$1" --size "$size" "${extra[@]}" "${own[@]}" \
    >"$work/serve-$1.out" 2>"$work/serve-$1.err" </dev/null &
  echo $! >"$pidf"
  for ((j = 0; j < 50; j++)); do
    grep -q "listening on" "$work/serve-$1.out" 2>/dev/null && exit 0
    kill -0 "$(cat "$pidf")" 2>/dev/null || break
    sleep 0.1
  done
  # The killed process's port (or a backing file's lock) may take a moment to be released.
  sleep 0.1
done
exit 1
SCRIPT
  } >"$1"
  chmod +x "$1"
}

# seed_files N: N reference files of 1 to 3 MiB in $WORK, copied into $MNT and synced.
seed_files() {
  local i
  for ((i = 0; i < $1; i++)); do
    dd if=/dev/urandom of="$WORK/f$i" bs=1M count=$((1 + i % 3)) status=none
    must "write f$i" cp "$WORK/f$i" "$MNT/f$i"
  done
  must "sync" sync -f "$MNT"
}

# check_files N WHEN: the N files of seed_files read back exactly from the servers.
check_files() {
  local i
  drop_caches "$MNT" || fail "drop caches failed ($2)"
  for ((i = 0; i < $1; i++)); do
    must "cmp f$i ($2)" cmp "$WORK/f$i" "$MNT/f$i"
  done
}

# start_fio_verify [KIB]: fio writes and verifies (crc32c, two jobs of 64 KiB random writes,
# RMEMFS_TEST_FIO_SIZE each) in $MNT in the background (FIO_PID, output in $WORK/fio.out);
# returns once its files hold KIB (default 4096) KiB, so a fault lands mid-write.
start_fio_verify() {
  local i want=${1:-4096}
  timeout -k 10 300 fio --name=v --directory="$MNT" --size="${RMEMFS_TEST_FIO_SIZE:-64M}" \
    --bs=64k --rw=randwrite --ioengine=psync --verify=crc32c --do_verify=1 --verify_fatal=1 \
    --numjobs=2 --group_reporting >"$WORK/fio.out" 2>&1 &
  FIO_PID=$!
  for ((i = 0; i < 600; i++)); do
    [ "$(du -skc "$MNT"/v.* 2>/dev/null | tail -n 1 | cut -f1)" -ge "$want" ] && return 0
    kill -0 "$FIO_PID" 2>/dev/null || break
    sleep 0.1
  done
  # The fault that follows must land while fio writes, not before or after it.
  fail "fio did not write $want KiB within 60 s (or ended first): the fault would miss it"
}

# finish_fio_verify WHEN: waits for start_fio_verify's fio; a timeout, a failure, a verify
# error or an EIO fails the test.
finish_fio_verify() {
  local rc=0
  wait "$FIO_PID" || rc=$?
  cat "$WORK/fio.out" >&2
  is_timeout "$rc" && fail "fio did not finish within 300 s ($1)"
  [ "$rc" -eq 0 ] || fail "fio failed (exit $rc) ($1)"
  ! grep -qiE "verify.*(bad|fail)|Input/output error" "$WORK/fio.out" || fail "fio errors ($1)"
}

# wait_copies N SECONDS WHEN: waits until $MNT's stats show every chunk at N live copies
# (none degraded, none lost, none with extra copies); prints the stats. Fails after SECONDS.
wait_copies() {
  local i st
  for ((i = 0; ; i++)); do
    st=$(t "$BIN" stats "$MNT") || fail "rmemfs stats failed ($3)"
    grep -qE "^chunks: $1 copies each; .* degraded 0, lost 0$" <<<"$st" && break
    [ "$i" -lt $(($2 * 2)) ] || fail "not at $1 copies $2 s $3: $(grep -E '^(chunks|rebuild)' <<<"$st")"
    sleep 0.5
  done
  printf '%s\n' "$st"
}

# all_chunks_on FILE ADDR: every chunk of FILE has a copy on the server at ADDR (its
# placement xattr says so).
all_chunks_on() {
  python3 mount-tests/placement_check.py "$1" --on "$2"
}

# start_copy_sampler: samples `stats --json` of $MNT over and over, one line each (chunks
# degraded, lost, with a copy to move) into $WORK/samples, until stop_copy_sampler.
start_copy_sampler() {
  : >"$WORK/samples"
  rm -f "$WORK/sampling-done"
  (
    while [ ! -e "$WORK/sampling-done" ]; do
      stats_field "$MNT" '" ".join(str(s["chunks"][k]) for k in ("degraded", "lost", "moving"))' \
        >>"$WORK/samples" 2>/dev/null || echo "stats failed" >>"$WORK/samples"
    done
  ) &
  SAMPLER_PID=$!
}

# stop_copy_sampler WHEN: stops the sampler; fails unless it took 3 samples or more and none
# showed a chunk short of its copies (or a failed `stats`).
stop_copy_sampler() {
  local n
  touch "$WORK/sampling-done"
  wait "$SAMPLER_PID" || true
  n=$(wc -l <"$WORK/samples")
  [ "$n" -ge 3 ] || fail "only $n samples of stats ($1)"
  if grep -qv '^0 0 ' "$WORK/samples"; then
    fail "a sample with chunks short of copies (degraded lost moving) ($1): $(grep -v '^0 0 ' "$WORK/samples" | head -n 3 | tr '\n' ';')"
  fi
  log "$n samples of stats ($1), none with a chunk short of its copies"
}

# wait_log FILE PATTERN SECONDS: waits until FILE has a line matching PATTERN (grep -E).
wait_log() {
  local k
  for ((k = 0; k < $3 * 2; k++)); do
    grep -qE "$2" "$1" 2>/dev/null && return 0
    sleep 0.5
  done
  return 1
}

# run_test_fn NAME TLOG: runs test_NAME in a subshell (errexit, the ERR trap naming the line)
# with its output in TLOG; prints why it failed (nothing when it passed).
run_test_fn() {
  local rc=0 reason
  set +e
  (
    trap - EXIT INT TERM
    set -eE
    trap 'on_err "$?" "${BASH_SOURCE[0]##*/}:$LINENO" "$BASH_COMMAND"' ERR
    "test_$1"
  ) >>"$2" 2>&1 </dev/null
  rc=$?
  set -e
  [ "$rc" -eq 0 ] && return 0
  # A skip (rc 3) reports its reason as "SKIPPED: …", which the runner counts apart.
  reason=$(head -n 1 "$REASON")
  echo "${reason:-the test exited $rc}"
}

# stats_field MNT EXPR: a value of `stats --json` of the mount at MNT (EXPR: a Python
# expression over `s`, the parsed JSON).
stats_field() {
  timeout -k 5 30 "$BIN" stats --json "$1" | python3 mount-tests/json_expr.py "$2"
}

# server_field ADDR EXPR [ARG...]: the same of `stats --server ADDR --json` (ARGs: more
# options, such as --secret-file).
server_field() {
  local addr=$1 expr=$2
  shift 2
  timeout -k 5 30 "$BIN" stats --server "$addr" "$@" --json |
    python3 mount-tests/json_expr.py "$expr"
}

# servers_sum FIELD: FIELD (of `stats --server --json`) of every server of $ADDRS, summed.
servers_sum() {
  local a total=0 f
  for a in ${ADDRS//,/ }; do
    f=$(server_field "$a" "s[\"$1\"]") || return 1
    total=$((total + f))
  done
  echo "$total"
}

# servers_total, servers_free: the size, and the free bytes, of every server of $ADDRS.
servers_total() { servers_sum total_bytes; }
servers_free() { servers_sum free_bytes; }
