#!/bin/sh
# docs/man: each page renders without a warning (groff -ww, else man -l;
# that part is skipped when neither is installed), and names every option
# the binaries' --help lists, so a new option cannot miss its page.
# The daemon's configuration keys (its table, printed by
# pe-executord --config-keys) and their documentation agree both ways:
# conf/pe-executord.conf and pe-executord.conf(5) document every key under
# its section, document no other key, show the table's default where they
# show one, and list exactly the reloadable keys as reloadable; and
# pe-executord --help names every option main.c accepts, each command-line
# override setting a key of the table.
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

# --- configuration keys ------------------------------------------------------------
export LC_ALL=C # one collation for sort, comm and join
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
conf=$src/conf/pe-executord.conf
conf5=$man_dir/pe-executord.conf.5
# Lines "section key<TAB>shown<TAB>default" (shown: 1 when the text gives a
# default, 0 when not), sorted.
"$build/pe-executord" --config-keys >"$tmp/table" || fail "pe-executord --config-keys failed"
awk -F '\t' '{ print $1 " " $2 "\t1\t" $4 }' "$tmp/table" | sort >"$tmp/table.keys"
# conf: "key = value" under a [section] header; a ";"-commented key shows no default.
awk '/^\[[a-z]+\]$/ { sec = substr($0, 2, length($0) - 2); next }
  sec && /^;? ?[a-z_]+ =/ {
    shown = !/^;/; line = $0; sub(/^;? ?/, "", line)
    key = line; sub(/ =.*/, "", key); val = line; sub(/^[a-z_]+ =/, "", val); sub(/^ /, "", val)
    print sec " " key "\t" shown "\t" (shown ? val : "")
  }' "$conf" | sort >"$tmp/conf.keys"
# conf.5: the .TP entries under ".SH [section]": .B key (no default) or
# .BR key " = default" [, key2 " = default2"].
awk '/^\.SH \[[a-z]+\]$/ { sec = substr($0, 6, length($0) - 6); prev = ""; next }
  /^\.SH/ { sec = ""; next }
  sec && prev == ".TP" && /^\.BR? / {
    rest = $0; sub(/^\.BR? /, "", rest); key = ""
    while (rest != "") {
      if (match(rest, /^"[^"]*"/)) { tok = substr(rest, 2, RLENGTH - 2); quoted = 1 }
      else { match(rest, /^[^ ]+/); tok = substr(rest, 1, RLENGTH); quoted = 0 }
      rest = substr(rest, RLENGTH + 1); sub(/^ +/, "", rest)
      if (!quoted && tok ~ /^[a-z_]+$/) {
        if (key != "") print sec " " key "\t0\t"
        key = tok
      } else if (quoted && key != "" && tok ~ /^ =/) {
        val = tok; sub(/^ = ?/, "", val); sub(/,? *$/, "", val)
        print sec " " key "\t1\t" val; key = ""
      }
    }
    if (key != "") print sec " " key "\t0\t"
  }
  { prev = $0 }' "$conf5" | sort >"$tmp/conf5.keys"
for doc in conf conf5; do
  case $doc in conf) file=$conf ;; conf5) file=$conf5 ;; esac
  cut -f1 "$tmp/$doc.keys" | sort >"$tmp/$doc.names"
  cut -f1 "$tmp/table.keys" | comm -23 - "$tmp/$doc.names" | while read -r sec key; do
    echo "FAIL: $file does not document [$sec] $key (pe-executord --config-keys lists it)" >&2
    echo x
  done | grep -q x && status=1
  cut -f1 "$tmp/table.keys" | comm -13 - "$tmp/$doc.names" | while read -r sec key; do
    echo "FAIL: $file documents [$sec] $key, which pe-executord does not have" >&2
    echo x
  done | grep -q x && status=1
  # Defaults where the text shows one (socket and state dir depend on the user: not shown).
  join -t "$(printf '\t')" "$tmp/table.keys" "$tmp/$doc.keys" | awk -F '\t' -v file="$file" \
    '$4 == 1 && $3 != $5 { split($1, k, " "); bad = 1
      print "FAIL: " file ": [" k[1] "] " k[2] " shows default \"" $5 "\", the daemon'"'"'s is \"" $3 "\"" }
     END { exit bad }' >&2 || status=1
done
# The reloadable keys: the conf's list (after "while running:", up to the
# line ending in '.') and the page's (after "A reload applies", up to
# "needs a restart"), against the table's "reload" keys.
awk -F '\t' '$5 == "reload" { print $2 }' "$tmp/table" | sort >"$tmp/reload.table"
awk '/while running:$/ { on = 1; next }
  on { line = $0; sub(/^; */, "", line); n = split(line, w, /[ ,.]+/)
       for (i = 1; i <= n; i++) if (w[i] != "") print w[i]
       if ($0 ~ /\.$/) on = 0 }' "$conf" | sort >"$tmp/reload.conf"
awk '/^A reload applies/ { on = 1; next }
  on && /needs a restart/ { on = 0 }
  on && /^\.BR? / { print $2 }' "$conf5" | sort >"$tmp/reload.conf5"
for doc in conf conf5; do
  case $doc in conf) file=$conf ;; conf5) file=$conf5 ;; esac
  diff "$tmp/reload.table" "$tmp/reload.$doc" >"$tmp/reload.diff" ||
    fail "$file: its list of reloadable keys differs from the daemon's (< only the daemon's, > only the file's): $(grep '^[<>]' "$tmp/reload.diff" | tr '\n' ' ')"
done

# --- pe-executord's options ---------------------------------------------------------
# Each long option of main.c's getopt table appears in --help (and so, by
# the check above, in pe-executord.8); each override sets a key of the table.
help=$("$build/pe-executord" --help 2>&1)
for opt in $(sed -n 's/.*{"\([a-z][a-z-]*\)", *[a-z]*_argument.*/\1/p' "$src/daemon/server/main.c"); do
  printf '%s\n' "$help" | grep -Eq -- "--$opt([^a-z-]|\$)" ||
    fail "pe-executord --help does not name --$opt (daemon/server/main.c accepts it)"
done
[ -n "$(sed -n 's/.*{"\([a-z][a-z-]*\)", *[a-z]*_argument.*/\1/p' "$src/daemon/server/main.c")" ] ||
  fail "no getopt_long options found in daemon/server/main.c"
sed -n 's/.*(pe_config_override){"\([a-z]*\)", "\([a-z_]*\)".*/\1 \2/p' \
  "$src/daemon/server/main.c" | while read -r sec key; do
  cut -f1 "$tmp/table.keys" | grep -qx "$sec $key" ||
    { echo "FAIL: daemon/server/main.c overrides [$sec] $key, which pe-executord does not have" >&2; echo x; }
done | grep -q x && status=1
exit $status
