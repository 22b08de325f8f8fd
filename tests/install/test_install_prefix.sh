#!/bin/sh
# `cmake --install BUILD --prefix P` into a scratch prefix P (staged under
# DESTDIR, so that nothing of it can reach this host's /etc or /usr):
#   1. every file lands under P: the staging directory holds nothing else,
#      and install_manifest.txt lists only paths under P;
#   2. the installed unit runs P's binary with P's config, and its User= is
#      the user that P's sysusers.d file creates (systemd-sysusers --dry-run
#      reads it, where installed);
#   3. peclient.pc: --cflags and --libs name directories of P, and a C
#      program compiled and linked with them runs against P's library;
#   4. find_package(peclient) (tests/install/consumer) configures, builds
#      and runs against P's library;
#   5. a second install keeps an edited config file and refreshes the
#      shipped copy beside the models.
# usage: test_install_prefix.sh SOURCE_DIR BUILD_DIR [SANITIZERS]
# SANITIZERS (the build's PE_SANITIZE, e.g. address,undefined): the consumer
# programs are built with them too, as a sanitized library needs.
set -eu
src=$1 build=$2 san=${3:-}
sanflags=${san:+-fsanitize=$san}
tmp=$(mktemp -d /tmp/pe-install-prefix-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

prefix=$tmp/prefix
stage=$tmp/stage
root=$stage$prefix # where P's files are while staged
DESTDIR=$stage cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log"; fail "cmake --install --prefix $prefix"; }

# 1. Nothing outside the prefix.
outside=$(find "$stage" ! -type d | grep -v "^$root/" || true)
[ -z "$outside" ] || fail "installed outside $prefix: $(echo $outside | sed "s|$stage||g")"
[ -s "$build/install_manifest.txt" ] || fail "no $build/install_manifest.txt"
# (The manifest names the files without DESTDIR.)
manifest=$(sed "s|^$stage/|/|" "$build/install_manifest.txt")
outside=$(printf '%s\n' "$manifest" | grep -v "^$prefix/" || true)
[ -z "$outside" ] || fail "install_manifest.txt lists paths outside $prefix: $(echo $outside)"
for f in lib/systemd/system/pe-executord.service etc/pe-executord/pe-executord.conf \
  lib/sysusers.d/pe-executord.conf; do
  printf '%s\n' "$manifest" | grep -qx "$prefix/$f" || fail "install_manifest.txt does not list $f"
done
echo "ok: $(wc -l <"$build/install_manifest.txt") files, all under the prefix"

# 2. The unit, the config it reads, the user it runs as.
unit=$root/lib/systemd/system/pe-executord.service
[ -f "$unit" ] || fail "no lib/systemd/system/pe-executord.service in the prefix"
exec_line=$(sed -n 's/^ExecStart=//p' "$unit")
exe=${exec_line%% *}
cfg=$(printf '%s\n' "$exec_line" | sed -n 's/.*--config \([^ ]*\).*/\1/p')
[ "$exe" = "$prefix/sbin/pe-executord" ] || fail "the unit runs $exe, not $prefix/sbin/pe-executord"
[ "$cfg" = "$prefix/etc/pe-executord/pe-executord.conf" ] ||
  fail "the unit reads $cfg, not $prefix/etc/pe-executord/pe-executord.conf"
[ -x "$stage$exe" ] || fail "$exe is not installed"
[ -f "$stage$cfg" ] || fail "$cfg is not installed"
cmp -s "$stage$cfg" "$src/conf/pe-executord.conf" || fail "$cfg is not conf/pe-executord.conf"
sysusers=$root/lib/sysusers.d/pe-executord.conf
[ -f "$sysusers" ] || fail "no lib/sysusers.d/pe-executord.conf in the prefix"
user=$(sed -n 's/^User=//p' "$unit")
group=$(sed -n 's/^Group=//p' "$unit")
awk -v u="$user" '$1 == "u" && $2 == u { found = 1 } END { exit !found }' "$sysusers" ||
  fail "$sysusers creates no user $user (the unit's User=)"
if [ "$group" != "$user" ]; then
  awk -v g="$group" '$1 == "g" && $2 == g { found = 1 } END { exit !found }' "$sysusers" ||
    fail "$sysusers creates no group $group (the unit's Group=)"
fi
if command -v systemd-sysusers >/dev/null 2>&1; then
  # An empty root: every user and group of the file is new there.
  mkdir -p "$tmp/sysroot"
  out=$(systemd-sysusers --root="$tmp/sysroot" --dry-run - <"$sysusers" 2>&1) ||
    fail "systemd-sysusers --dry-run $sysusers: $out"
  printf '%s\n' "$out" | grep -q "Creating user '$user'" ||
    fail "systemd-sysusers would not create $user: $out"
  echo "ok: systemd-sysusers --dry-run creates $user"
fi
echo "ok: the unit runs $exe --config $cfg as $user:$group"

# 3. pkg-config.
pc=$(find "$root" -name peclient.pc)
[ -n "$pc" ] || fail "no peclient.pc in the prefix"
export PKG_CONFIG_PATH="${pc%/peclient.pc}"
flags=$(pkg-config --cflags --libs peclient) || fail "pkg-config --cflags --libs peclient"
for f in $flags; do
  case $f in
    -I* | -L*) d=${f#-?}
               [ -d "$d" ] || fail "pkg-config names $d ($f), not a directory"
               case $(readlink -f "$d")/ in "$(readlink -f "$root")"/*) ;; *)
                 fail "pkg-config names $d, outside the prefix";; esac;;
  esac
done
libdir=$(pkg-config --variable=libdir peclient)
version=$(pkg-config --modversion peclient)
cc $sanflags -o "$tmp/pc-consumer" "$src/tests/install/consumer/main.c" $flags >"$tmp/cc.log" 2>&1 ||
  { cat "$tmp/cc.log"; fail "cc with pkg-config's flags: $flags"; }
LD_LIBRARY_PATH=$libdir "$tmp/pc-consumer" "$version" || fail "the pkg-config build does not run"
echo "ok: pkg-config: $flags"

# 4. find_package(peclient).
cmake -S "$src/tests/install/consumer" -B "$tmp/cm" -DCMAKE_PREFIX_PATH="$root" \
  -DCMAKE_C_FLAGS="$sanflags" -DCMAKE_EXE_LINKER_FLAGS="$sanflags" \
  >"$tmp/cm.log" 2>&1 || { cat "$tmp/cm.log"; fail "find_package(peclient) with prefix $root"; }
cmake --build "$tmp/cm" >>"$tmp/cm.log" 2>&1 || { cat "$tmp/cm.log"; fail "build with peclient::peclient"; }
"$tmp/cm/consumer" "$version" || fail "the find_package build does not run"
ldd "$tmp/cm/consumer" | grep -q "$root/.*libpeclient.so.0" ||
  fail "the find_package build does not load the prefix's libpeclient.so.0: $(ldd "$tmp/cm/consumer")"
echo "ok: find_package(peclient) builds and runs against $root"

# 5. A second install keeps the edited config.
echo "threads = 3 ; edited here" >>"$stage$cfg"
DESTDIR=$stage cmake --install "$build" --prefix "$prefix" >"$tmp/install2.log" 2>&1 ||
  { cat "$tmp/install2.log"; fail "second cmake --install"; }
grep -q "edited here" "$stage$cfg" || fail "a second install overwrote the edited $cfg"
shipped=$root/share/pe-executord/pe-executord.conf
cmp -s "$shipped" "$src/conf/pe-executord.conf" || fail "no shipped config at $shipped"
grep -q "$cfg" "$tmp/install2.log" || fail "the second install does not say it kept $cfg"
echo "ok: a second install keeps the edited $cfg"
