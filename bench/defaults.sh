#!/bin/sh
# What a user gets from the defaults, against the best setting given by hand,
# in interleaved rounds on this machine.
#
# usage: bench/defaults.sh [--rounds N] [--build DIR] [--json] MODEL [TRAIN OPTIONS...]
#   MODEL          mlp | cnn | a model file (as pe-client train --model)
#   --rounds N     rounds (3); each runs every setting once, in the order below
#   --build DIR    the build with pe-executord, pe-client and pe-bench (./build)
#   --json         end with one JSON line: every run's samples/s and the ratios
#   TRAIN OPTIONS  given to every run (pe-client train and pe-bench train both
#                  take --epochs, --steps, --batch, --seed)
#
# Two scratch daemons with private sockets and state dirs: one with default
# settings (places = auto: the first round's register runs the places trial,
# the later rounds find its choice remembered) and one with --places cpu:CORES
# (strategy auto). Each round trains, one run after another:
#   daemon-defaults      pe-client train on the default daemon
#   bench-cpuN-sharded   pe-bench in process, cpu:CORES, sharded
#   daemon-cpuN          pe-client train on the cpu:CORES daemon (sharded)
#   bench-cpuN-allreduce, bench-cpuN-reduce
#   bench-seq1           pe-bench sequential, 1 intra-op thread
#   bench-seqN           pe-bench sequential, CORES intra-op threads
# (on one core: daemon-defaults, daemon-cpuN and bench-seq1 only).
#
# Ratios are taken within a round, whose runs lie seconds apart, because a
# shared machine's speed moves by tens of percent within minutes:
#   defaults/best    daemon-defaults against the round's fastest other run
#   defaults/seq1    daemon-defaults against bench-seq1
#   daemon/bench     daemon-cpuN against bench-cpuN-sharded (the same places,
#                    strategy and batch)
# and each is summarised by its median and smallest value over the rounds.
# Exit status: 0, 1 when a run failed (named, with the end of its stderr),
# 2 on bad usage.
set -u

say() { echo "defaults: $*" >&2; }
usage() {
  say "$1"
  echo "usage: bench/defaults.sh [--rounds N] [--build DIR] [--json] mlp|cnn|FILE [TRAIN OPTIONS...]" >&2
  exit 2
}

rounds=3
build=$(cd "$(dirname "$0")/.." && pwd)/build
json=false
while [ $# -gt 0 ]; do
  case "$1" in
  --rounds) [ $# -ge 2 ] || usage "--rounds needs a value"
    rounds=$2; shift 2 ;;
  --build) [ $# -ge 2 ] || usage "--build needs a value"
    build=$2; shift 2 ;;
  --json) json=true; shift ;;
  -*) usage "unknown option '$1' before the model (known: --rounds, --build, --json)" ;;
  *) break ;;
  esac
done
[ $# -ge 1 ] || usage "no model (mlp, cnn or a model file)"
model=$1
shift
case "$rounds" in
'' | *[!0-9]*) usage "--rounds '$rounds' is not a whole number" ;;
esac
[ "$rounds" -ge 1 ] && [ "$rounds" -le 100 ] || usage "--rounds $rounds (1 to 100)"
for b in pe-executord pe-client pe-bench; do
  [ -x "$build/$b" ] || usage "$build/$b is missing (build first: ./pe build, or --build DIR)"
done
case "$model" in
mlp | cnn) ;;
*) [ -r "$model" ] || usage "model '$model': not mlp or cnn, and no readable model file" ;;
esac

cores=$(nproc 2>/dev/null || echo 1)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/pe-defaults.XXXXXX")
pids=""
cleanup() {
  for p in $pids; do kill "$p" 2>/dev/null; done
  for p in $pids; do wait "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# start_daemon NAME [OPTIONS...]: a scratch daemon on ipc://$tmp/NAME.sock.
start_daemon() {
  name=$1
  shift
  "$build/pe-executord" --socket "ipc://$tmp/$name.sock" --state-dir "$tmp/state-$name" "$@" \
    >"$tmp/$name.log" 2>&1 &
  pids="$pids $!"
  i=0
  while [ ! -S "$tmp/$name.sock" ]; do
    i=$((i + 1))
    if [ $i -gt 200 ]; then
      say "daemon $name did not open its socket in 20 s; its log ends with:"
      tail -n 10 "$tmp/$name.log" >&2
      exit 1
    fi
    sleep 0.1
  done
}
start_daemon auto
start_daemon fixed --places "cpu:$cores"

# run ROUND LABEL COMMAND...: the run's JSON line goes to $tmp/runs as
# "ROUND LABEL JSON"; a failed run is named in $failed.
failed=""
run() {
  r=$1
  label=$2
  shift 2
  if line=$("$@" 2>"$tmp/err") && line=$(printf '%s\n' "$line" | grep '^{' | tail -n 1) &&
    [ -n "$line" ]; then
    printf '%s %s %s\n' "$r" "$label" "$line" >>"$tmp/runs"
  else
    say "round $r: $label failed; its stderr ends with:"
    tail -n 10 "$tmp/err" >&2
    failed="$failed $label@$r"
  fi
}

client() { # socket name, round, train options...
  sock=$1
  r=$2
  shift 2
  "$build/pe-client" --socket "ipc://$tmp/$sock.sock" train --model "$model" \
    --model-name "defaults-$sock-$r" --quiet --json "$@"
}
bench() { "$build/pe-bench" train --model "$model" --roofline off --json "$@"; }

: >"$tmp/runs"
for r in $(seq 1 "$rounds"); do
  say "round $r of $rounds ($(date +%H:%M:%S))"
  run "$r" daemon-defaults client auto "$r" "$@"
  [ "$cores" -ge 2 ] &&
    run "$r" bench-cpuN-sharded bench --executor parallel --places "cpu:$cores" --strategy sharded "$@"
  run "$r" daemon-cpuN client fixed "$r" "$@"
  if [ "$cores" -ge 2 ]; then
    run "$r" bench-cpuN-allreduce bench --executor parallel --places "cpu:$cores" \
      --strategy allreduce "$@"
    run "$r" bench-cpuN-reduce bench --executor parallel --places "cpu:$cores" --strategy reduce "$@"
  fi
  run "$r" bench-seq1 bench --threads 1 "$@"
  [ "$cores" -ge 2 ] && run "$r" bench-seqN bench --threads "$cores" "$@"
done

# The trial's choice, as the first defaults run reported it.
# (Its candidates' array holds objects: the object ends at the array's end.)
first=$(awk '$2 == "daemon-defaults" { print; exit }' "$tmp/runs")
trial=$(printf '%s\n' "$first" | sed -n 's/.*"places_trial":\({[^]]*\]}\).*/\1/p')
[ -n "$trial" ] || trial=$(printf '%s\n' "$first" | sed -n 's/.*"places_trial":\({[^}]*}\).*/\1/p')

awk -v model="$model" -v cores="$cores" -v rounds="$rounds" -v json="$json" -v trial="$trial" '
  function median(v, n,   i, j, t, s) {
    for (i = 1; i <= n; i++) s[i] = v[i]
    for (i = 2; i <= n; i++)
      for (j = i; j > 1 && s[j - 1] > s[j]; j--) { t = s[j]; s[j] = s[j - 1]; s[j - 1] = t }
    return n % 2 ? s[(n + 1) / 2] : (s[n / 2] + s[n / 2 + 1]) / 2
  }
  function least(v, n,   i, m) {
    m = v[1]
    for (i = 2; i <= n; i++) if (v[i] < m) m = v[i]
    return m
  }
  {
    line = $0
    sps = line; sub(/.*"samples_per_sec":/, "", sps); sub(/[,}].*/, "", sps)
    if (!($2 in seen)) { seen[$2] = 1; order[++nl] = $2 }
    rate[$1, $2] = sps + 0; have[$1, $2] = 1
  }
  # ratio NAME A B: rate A / rate B in every round that has both.
  function ratio(name, a, b,   r, n, v) {
    n = 0
    for (r = 1; r <= rounds; r++)
      if (rate[r, a] > 0 && rate[r, b] > 0) v[++n] = rate[r, a] / rate[r, b]
    nr[name] = n
    for (r = 1; r <= n; r++) rv[name, r] = v[r]
    if (n) { rmed[name] = median(v, n); rmin[name] = least(v, n) }
  }
  END {
    if (!nl) exit 1
    # defaults/best: the best of the round, the defaults run left out.
    for (r = 1; r <= rounds; r++) {
      best = 0
      for (i = 1; i <= nl; i++)
        if (order[i] != "daemon-defaults" && rate[r, order[i]] > best) best = rate[r, order[i]]
      rate[r, "best-by-hand"] = best
    }
    ratio("defaults/best", "daemon-defaults", "best-by-hand")
    ratio("defaults/seq1", "daemon-defaults", "bench-seq1")
    ratio("daemon/bench", "daemon-cpuN", "bench-cpuN-sharded")
    names[1] = "defaults/best"; names[2] = "defaults/seq1"; names[3] = "daemon/bench"
    printf "%s, %d core(s), N = %d: samples/s per round, median\n", model, cores, cores
    printf "  %-22s", "run"
    for (r = 1; r <= rounds; r++) printf " %10s", "round " r
    printf " %10s\n", "median"
    for (i = 1; i <= nl; i++) {
      n = 0
      printf "  %-22s", order[i]
      for (r = 1; r <= rounds; r++) {
        if (have[r, order[i]]) { printf " %10.1f", rate[r, order[i]]; v[++n] = rate[r, order[i]] }
        else printf " %10s", "-"
      }
      printf " %10.1f\n", n ? median(v, n) : 0
      delete v
    }
    printf "ratios within each round, median, smallest\n"
    for (k = 1; k <= 3; k++) {
      printf "  %-22s", names[k]
      for (r = 1; r <= nr[names[k]]; r++) printf " %10.3f", rv[names[k], r]
      for (; r <= rounds; r++) printf " %10s", "-"
      if (nr[names[k]]) printf " %10.3f  (smallest %.3f)\n", rmed[names[k]], rmin[names[k]]
      else printf " %10s\n", "-"
    }
    if (trial != "") printf "places trial (first register): %s\n", trial
    if (json != "true") exit 0
    printf "{\"bench\":\"defaults\",\"model\":\"%s\",\"cores\":%d,\"rounds\":%d,\"samples_per_sec\":{", model, cores, rounds
    for (i = 1; i <= nl; i++) {
      printf "%s\"%s\":[", (i > 1 ? "," : ""), order[i]
      sep = ""
      for (r = 1; r <= rounds; r++)
        if (have[r, order[i]]) { printf "%s%.1f", sep, rate[r, order[i]]; sep = "," }
      printf "]"
    }
    printf "},\"ratios\":{"
    for (k = 1; k <= 3; k++) {
      printf "%s\"%s\":{\"rounds\":[", (k > 1 ? "," : ""), names[k]
      for (r = 1; r <= nr[names[k]]; r++) printf "%s%.4f", (r > 1 ? "," : ""), rv[names[k], r]
      if (nr[names[k]]) printf "],\"median\":%.4f,\"smallest\":%.4f}", rmed[names[k]], rmin[names[k]]
      else printf "],\"median\":null,\"smallest\":null}"
    }
    printf "},\"places_trial\":%s}\n", trial != "" ? trial : "null"
  }' "$tmp/runs"
status=$?
if [ -n "$failed" ]; then
  say "failed:$failed"
  exit 1
fi
exit $status
