#!/bin/sh
# docs/man: each page renders without a warning (groff -ww, else man -l;
# that part is skipped when neither is installed), and names every option
# the binaries' --help lists and every key of conf/pe-executord.conf, so a
# new option or key cannot miss its page.
# usage: test_man_pages.sh SOURCE_DIR BUILD_DIR
set -eu
src=$1 build=$2
man_dir=$src/docs/man
status=0
fail() { echo "FAIL: $*" >&2; status=1; }

for page in "$man_dir"/*.[158]; do
  if command -v groff >/dev/null 2>&1; then
    out=$(groff -man -Tutf8 -ww -z "$page" 2>&1)
  elif command -v man >/dev/null 2>&1; then
    out=$(MANWIDTH=80 man --warnings -l "$page" 2>&1 >/dev/null)
  else
    echo "skip: neither groff nor man to render $page"
    continue
  fi
  [ -z "$out" ] || fail "$page: $out"
done

# The page's text with roff's \- as -, one string to grep.
text() { sed 's/\\-/-/g' "$man_dir/$1"; }

# has PAGE WORD...: each --option (or key) appears in PAGE as a whole word.
has() {
  page=$1; shift
  body=$(text "$page")
  for w in "$@"; do
    printf '%s\n' "$body" | grep -Eq -- "(^|[^a-z0-9_-])$w([^a-z0-9_-]|\$)" ||
      fail "$page does not mention $w"
  done
}

opts() { grep -Eo -- '--[a-z][a-z0-9-]*' | sort -u; }

has pe-executord.8 $("$build/pe-executord" --help 2>&1 | opts)
has pe-client.1 $("$build/pe-client" --help 2>&1 | opts)
for cmd in $("$build/pe-client" --help 2>&1 | sed -n 's/^  \([a-z][a-z-]*\) .*/\1/p'); do
  has pe-client.1 "$cmd" $("$build/pe-client" "$cmd" --help 2>&1 | opts)
done
for cmd in $("$build/pe-bench" --help 2>&1 | sed -n 's/^  \([a-z][a-z-]*\) .*/\1/p'); do
  has pe-bench.1 "$cmd" $("$build/pe-bench" "$cmd" --help 2>&1 | opts)
done
has pe-bench.1 --version
has pe-executord.conf.5 $(sed -n 's/^\[\([a-z]*\)\]$/\\[\1\\]/p; s/^;* *\([a-z_]*\) =.*/\1/p' \
  "$src/conf/pe-executord.conf" | sort -u)
exit $status
