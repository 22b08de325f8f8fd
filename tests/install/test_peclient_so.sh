#!/bin/sh
# libpeclient.so, the trainers' shared library:
#   1. its SONAME carries the ABI version (libpeclient.so.0);
#   2. it exports exactly the functions the public headers (client/include)
#      declare: none missing, and nothing else (the pec_/peb_ internals, the
#      protobuf-c messages of pe_proto, strmap and the shm helpers stay
#      local: a trainer's own protobuf-c code cannot clash with them);
#   3. it needs no symbol that none of its libraries has (ldd -r);
#   4. cmake --install puts the library, its SONAME link and the linker's
#      libpeclient.so link beside the archive.
# usage: test_peclient_so.sh SOURCE_DIR BUILD_DIR
set -eu
src=$1 build=$2
tmp=$(mktemp -d /tmp/pe-peclient-so-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

so=$build/libpeclient.so
[ -f "$so" ] || fail "no $so"
soname=$(readelf -d "$so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = libpeclient.so.0 ] || fail "SONAME '$soname', not libpeclient.so.0"

# The functions the headers declare: identifiers followed by '(' outside
# comments (cpp -fpreprocessed drops the comments and keeps the macros).
for h in "$src"/client/include/*.h; do
  cpp -fpreprocessed -dD -P "$h" 2>/dev/null
done | grep -v '^#' | grep -oE '\bpe_[a-z0-9_]+ *\(' | tr -d ' (' | sort -u >"$tmp/declared"
[ -s "$tmp/declared" ] || fail "no function found in $src/client/include"
nm -D --defined-only "$so" | awk '$2 ~ /^[TtWiDdBbRr]$/ { sub(/@.*/, "", $3); print $3 }' |
  sort -u >"$tmp/exported"
extra=$(comm -13 "$tmp/declared" "$tmp/exported")
missing=$(comm -23 "$tmp/declared" "$tmp/exported")
[ -z "$extra" ] || fail "exported but not in client/include: $(echo $extra)"
[ -z "$missing" ] || fail "declared in client/include but not exported: $(echo $missing)"
echo "ok: $so ($soname) exports the $(wc -l <"$tmp/exported") functions of client/include"

undefined=$(ldd -r "$so" 2>&1 | grep 'undefined symbol' || true)
[ -z "$undefined" ] || fail "$undefined"

DESTDIR=$tmp/dest cmake --install "$build" >/dev/null
for f in libpeclient.so libpeclient.so.0 libpeclient.a; do
  [ -n "$(find "$tmp/dest" -name "$f")" ] || fail "cmake --install did not install $f"
done
real=$(find "$tmp/dest" -name libpeclient.so.0)
[ -f "$(readlink -f "$real")" ] || fail "$real does not lead to the library"
echo "ok: cmake --install installs libpeclient.so, libpeclient.so.0 and libpeclient.a"
