#!/bin/sh
# The layers of docs/architecture.md hold in the includes: no arrow runs back
# up the floors.
#  - daemon's floors, lowest first, are FLOORS; a file of one floor includes
#    headers of its own floor and the floors below it only. A folder of
#    daemon/ that is in no floor fails, so a new one gets its place here.
#  - cuda (the plug-in backend) may include every floor up to engine. Nothing
#    outside daemon/cuda includes cuda/ (the backend registers itself when
#    the program loads; tests/ exercise it directly and are not scanned).
#  - PE_HAVE_CUDA appears in no file of the floors up to engine: they name
#    no backend.
#  - client/ includes nothing from daemon/ but CLIENT_MAY (libpeclient
#    compiles the name index; pe-client links the checkpoint format, which
#    stands on core alone).
# usage: test_layers.sh SOURCE_DIR
set -eu
src=$1
FLOORS="core format ir ops compiler engine net server"
BACKEND_TOP=engine # the highest floor cuda may include
NO_BACKEND_NAMES="core format ir ops compiler engine"
CLIENT_MAY="core/strmap.h format/checkpoint_format.h format/durable_file.h"

tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
status=0
fail() { echo "FAIL: $*" >&2; status=1; }

# rank FLOOR: its position in FLOORS (1 = lowest), 0 when it is none.
rank() {
  i=0
  for f in $FLOORS; do
    i=$((i + 1))
    [ "$f" = "$1" ] && echo $i && return
  done
  echo 0
}

# includes DIR...: "FILE INCLUDED" for each #include "..." of the C, C++,
# CUDA and header files under DIR.
includes() {
  find "$@" -type f \( -name '*.c' -o -name '*.cpp' -o -name '*.h' -o -name '*.cu' \) -print |
    sort | while read -r file; do
      sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$file" |
        while read -r inc; do echo "$file $inc"; done
    done
}

cd "$src"

# Every folder of daemon/ is a floor or the backend.
for d in daemon/*/; do
  d=${d%/}
  name=${d#daemon/}
  [ "$name" = cuda ] || [ "$(rank "$name")" -gt 0 ] ||
    fail "$d: in no floor of tests/install/test_layers.sh (FLOORS=\"$FLOORS\")"
done

top_rank=$(rank "$BACKEND_TOP")
includes daemon >"$tmp"
while read -r file inc; do
  from=${file#daemon/}
  from=${from%%/*}
  to=${inc%%/*}
  [ "$to" != "$inc" ] || continue # same folder: same floor
  if [ "$to" = cuda ]; then
    [ "$from" = cuda ] || fail "$file includes $inc: only daemon/cuda includes cuda/"
    continue
  fi
  to_rank=$(rank "$to")
  [ "$to_rank" -gt 0 ] || continue # not a floor (proto's generated headers, common/)
  if [ "$from" = cuda ]; then
    [ "$to_rank" -le "$top_rank" ] ||
      fail "$file includes $inc: cuda includes floors up to $BACKEND_TOP only"
    continue
  fi
  from_rank=$(rank "$from")
  [ "$from_rank" -gt 0 ] || continue # reported above
  [ "$to_rank" -le "$from_rank" ] ||
    fail "$file includes $inc: $from is below $to (floors, lowest first: $FLOORS)"
done <"$tmp"

for f in $NO_BACKEND_NAMES; do
  [ -d "daemon/$f" ] || continue
  hits=$(grep -rln 'PE_HAVE_CUDA' "daemon/$f" || true)
  for h in $hits; do fail "$h names PE_HAVE_CUDA: $f names no backend"; done
done

# Outside daemon/: client/ takes only CLIENT_MAY from daemon/; nothing
# includes cuda/.
for dir in client common bench; do
  [ -d "$dir" ] || continue
  includes "$dir" >"$tmp"
  while read -r file inc; do
    to=${inc%%/*}
    [ "$to" != "$inc" ] || continue
    if [ "$to" = cuda ]; then
      fail "$file includes $inc: only daemon/cuda includes cuda/"
    elif [ "$dir" = client ] && [ "$(rank "$to")" -gt 0 ]; then
      case " $CLIENT_MAY " in
        *" $inc "*) ;;
        *) fail "$file includes $inc: client/ takes from daemon/ only $CLIENT_MAY" ;;
      esac
    fi
  done <"$tmp"
done

[ $status -eq 0 ] && echo "layers: ok"
exit $status
