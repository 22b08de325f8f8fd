#!/bin/sh
# The installed unit must name files that the install puts there (with
# prefix /usr the config must go to /etc, which the unit reads, not /usr/etc).
#   1. DESTDIR install of this build tree: ExecStart's binary and --config
#      file exist under DESTDIR.
#   2. A scratch configure of the source with prefix /usr (no build: the
#      `service` component is the unit, the config and the man pages): the
#      same check, and the config is /etc/pe-executord/pe-executord.conf.
#   Both: the unit's Documentation= pages and files are installed.
# usage: test_install_paths.sh SOURCE_DIR BUILD_DIR
set -eu
src=$1 build=$2
tmp=$(mktemp -d /tmp/pe-install-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# check DESTDIR [binary too]: the unit's ExecStart paths exist under DESTDIR.
check() {
  dest=$1
  unit=$(find "$dest" -name pe-executord.service -path '*/systemd/system/*')
  [ -n "$unit" ] || fail "no pe-executord.service under $dest"
  exec_line=$(sed -n 's/^ExecStart=//p' "$unit")
  exe=${exec_line%% *}
  cfg=$(printf '%s\n' "$exec_line" | sed -n 's/.*--config \([^ ]*\).*/\1/p')
  [ -n "$cfg" ] || fail "ExecStart has no --config: $exec_line"
  [ -f "$dest$cfg" ] || fail "the unit reads $cfg, the install has: $(cd "$dest" && find . -name '*.conf')"
  if [ "${2:-}" = binary ]; then
    [ -x "$dest$exe" ] || fail "the unit runs $exe, not installed under $dest"
  fi
  # Documentation=man:NAME(S) and file:///PATH name installed files.
  for doc in $(sed -n 's/^Documentation=//p' "$unit"); do
    case $doc in
      man:*) page=${doc#man:}; name=${page%%(*}; sec=${page#*(}; sec=${sec%)}
             [ -n "$(find "$dest" -path "*/man/man$sec/$name.$sec")" ] ||
               fail "Documentation=$doc: no man$sec/$name.$sec under $dest";;
      file://*) [ -f "$dest${doc#file://}" ] || fail "Documentation=$doc: not installed";;
      *) fail "Documentation=$doc: not checked here";;
    esac
  done
  echo "ok: $unit -> $exe --config $cfg"
}

DESTDIR=$tmp/built cmake --install "$build" >/dev/null
check "$tmp/built" binary

cmake -S "$src" -B "$tmp/usr" -DCMAKE_INSTALL_PREFIX=/usr -DPE_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=Release >"$tmp/configure.log" 2>&1 || { cat "$tmp/configure.log"; fail "configure"; }
DESTDIR=$tmp/usr-dest cmake --install "$tmp/usr" --component service >/dev/null
check "$tmp/usr-dest"
[ -f "$tmp/usr-dest/etc/pe-executord/pe-executord.conf" ] ||
  fail "prefix /usr: no /etc/pe-executord/pe-executord.conf"
[ -f "$tmp/usr-dest/usr/lib/systemd/system/pe-executord.service" ] ||
  fail "prefix /usr: no /usr/lib/systemd/system/pe-executord.service"
