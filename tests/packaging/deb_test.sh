#!/usr/bin/env bash
# The Debian package end to end (ctest deb_test, label e2e): builds it with
# scripts/package-deb.sh from BUILD_DIR, installs it with dpkg -i, checks the
# files, the `bonsai` user, `/usr/bin/bonsai --version`, the unit
# (systemd-analyze verify, where systemd is installed), serves a completion
# with the installed binary as the bonsai user from /etc/bonsai/bonsai.toml
# and drains on SIGTERM (exit 0), then purges the package and removes the
# user it created, leaving the machine as it was.
# Usage: deb_test.sh BUILD_DIR
# Needs root and no bonsai package already installed: exit 77 (skipped)
# otherwise, unless CI=true (then it fails).
set -euo pipefail
BUILD="$(cd "$1" && pwd)"
SRC="$(cd "$(dirname "$0")/../.." && pwd)"
skip() { if [ "${CI:-}" = "true" ]; then echo "FAIL: $1"; exit 1; fi; echo "SKIP: $1"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "dpkg -i needs root"
command -v dpkg >/dev/null && command -v cpack >/dev/null || skip "dpkg or cpack is missing"
# Two suites on one machine (two clones) take turns: one package, one user.
exec 9>/var/lock/bonsai_deb_test.lock
flock -w 300 9 || skip "another deb_test held /var/lock/bonsai_deb_test.lock for 300 s"
if dpkg-query -W -f='${Status}' bonsai 2>/dev/null | grep -q "install ok installed"; then
  skip "a bonsai package is already installed (not this test's to remove)"
fi
USER_EXISTED=0
getent passwd bonsai >/dev/null && USER_EXISTED=1

WORK="$(mktemp -d /tmp/bonsai_deb_test.XXXXXX)"
SERVER_PID=""
INSTALLED=0
cleanup() {
  if [ -n "$SERVER_PID" ]; then kill -KILL "$SERVER_PID" 2>/dev/null || true; fi
  if [ "$INSTALLED" = 1 ]; then dpkg --purge bonsai >/dev/null 2>&1 || true; fi
  if [ "$USER_EXISTED" = 0 ] && getent passwd bonsai >/dev/null; then userdel bonsai 2>/dev/null || true; fi
  if [ "$USER_EXISTED" = 0 ] && getent group bonsai >/dev/null; then groupdel bonsai 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
FAILS=0
ok() { echo "ok - $1"; }
bad() { echo "not ok - $1"; FAILS=$((FAILS + 1)); }
check() { if [ "$2" = "$3" ]; then ok "$1"; else bad "$1 (want '$2', got '$3')"; fi; }

T0=$SECONDS
DEB="$(BUILD_DIR="$BUILD" "$SRC/scripts/package-deb.sh" "$WORK/out" | tail -1)"
echo "# package-deb.sh: $((SECONDS - T0)) s"
[ -f "$DEB" ] || { echo "FAIL: no .deb built"; exit 1; }
ok "built $(basename "$DEB") ($(stat -c %s "$DEB") bytes)"
check "package name" "bonsai" "$(dpkg-deb -f "$DEB" Package)"
DEPENDS="$(dpkg-deb -f "$DEB" Depends)"
for lib in libc6 libcurl4 adduser; do
  case "$DEPENDS" in *"$lib"*) ok "Depends has $lib" ;; *) bad "Depends lacks $lib: $DEPENDS" ;; esac
done
check "the config is a conffile" "/etc/bonsai/bonsai.toml" "$(dpkg-deb --ctrl-tarfile "$DEB" | tar -xO ./conffiles)"

# dpkg -i; another dpkg / apt run (a setup.sh elsewhere) holding dpkg's lock is waited for, up to 2 min.
for try in $(seq 60); do
  if dpkg -i "$DEB" >"$WORK/dpkg.log" 2>&1; then INSTALLED=1; break; fi
  grep -q "lock" "$WORK/dpkg.log" || break
  sleep 2
done
[ "$INSTALLED" = 1 ] || { cat "$WORK/dpkg.log"; echo "FAIL: dpkg -i (try $try)"; exit 1; }
ok "dpkg -i"
check "bonsai --version" "bonsai 0.1.0" "$(/usr/bin/bonsai --version)"
for f in /usr/bin/bonsai /usr/lib/systemd/system/bonsai.service /etc/bonsai/bonsai.toml /usr/share/man/man1/bonsai.1.gz; do
  [ -f "$f" ] && ok "installed $f" || bad "missing $f"
done
check "the system user" "/var/lib/bonsai" "$(getent passwd bonsai | cut -d: -f6)"
check "its state folder" "bonsai" "$(stat -c %U /var/lib/bonsai)"
if command -v systemd-analyze >/dev/null; then
  if systemd-analyze verify /usr/lib/systemd/system/bonsai.service >"$WORK/verify" 2>&1; then
    ok "systemd-analyze verify"
  else
    bad "systemd-analyze verify: $(cat "$WORK/verify")"
  fi
else
  echo "# systemd-analyze not installed: unit not verified"
fi
grep -q '^ExecStart=/usr/bin/bonsai serve --config /etc/bonsai/bonsai.toml$' /usr/lib/systemd/system/bonsai.service &&
  ok "the unit runs serve with the config" || bad "ExecStart"

# Serve as the unit would: the bonsai user, HOME=/var/lib/bonsai, the packaged config (port 0: any free one).
cd /var/lib/bonsai
# setpriv execs (no forking parent): the signal below reaches the server itself.
setpriv --reuid=bonsai --regid=bonsai --init-groups env -i HOME=/var/lib/bonsai HF_HOME=/var/lib/bonsai/huggingface PATH=/usr/bin:/bin \
  /usr/bin/bonsai serve --config /etc/bonsai/bonsai.toml --port 0 -t 1 -np 1 --pool-size 1 \
  >"$WORK/sout" 2>"$WORK/serr" &
SERVER_PID=$!
cd /
URL=""
for _ in $(seq 600); do
  URL="$(sed -n 's/.*listening on \(http:[^ ]*\).*/\1/p' "$WORK/sout" 2>/dev/null | head -1)"
  [ -n "$URL" ] && break
  kill -0 "$SERVER_PID" 2>/dev/null || break
  sleep 0.1
done
if [ -n "$URL" ]; then
  code="$(curl -s -o "$WORK/resp" -w '%{http_code}' "$URL/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt":"hi","max_tokens":3}')"
  check "the installed server answers a completion" "200" "$code"
  grep -q '"text"' "$WORK/resp" && ok "the completion has text" || bad "completion: $(cat "$WORK/resp")"
  kill -TERM "$SERVER_PID"
  rc=0
  wait "$SERVER_PID" || rc=$?
  SERVER_PID=""
  check "SIGTERM drains and exits 0" "0" "$rc"
  grep -q "bonsai serve: stopped" "$WORK/serr" && ok "stopped cleanly" || bad "no clean stop: $(tail -3 "$WORK/serr")"
else
  bad "the installed server did not start: $(cat "$WORK/serr")"
fi

purged=0
for _ in $(seq 60); do
  if dpkg --purge bonsai >"$WORK/dpkg.log" 2>&1; then purged=1; break; fi
  grep -q "lock" "$WORK/dpkg.log" || break
  sleep 2
done
[ "$purged" = 1 ] && ok "dpkg --purge" || bad "dpkg --purge: $(cat "$WORK/dpkg.log")"
INSTALLED=$((1 - purged))
for f in /usr/bin/bonsai /usr/lib/systemd/system/bonsai.service /etc/bonsai /var/lib/bonsai; do
  [ -e "$f" ] && bad "left after purge: $f" || ok "purged $f"
done
echo "deb_test: $FAILS failure(s)"
[ "$FAILS" -eq 0 ]
