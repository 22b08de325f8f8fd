#!/bin/sh
# bench/defaults.sh: its usage errors, a failed run reported as one, and a
# short real measurement whose summary agrees with its own runs (every
# setting in every round, the ratios and medians recomputed from the
# samples/s it printed, the places trial's choice).
# usage: test_defaults_script.sh SOURCE_DIR BUILD_DIR
set -u
src=$1
bin=$2
script="$src/bench/defaults.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
fail() { echo "FAIL: $*" >&2; status=1; }

# expect_usage WHAT PATTERN ARGS...: exit 2 and PATTERN on stderr.
expect_usage() {
  what=$1
  pattern=$2
  shift 2
  sh "$script" "$@" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  [ $rc -eq 2 ] || fail "$what: exit $rc, want 2"
  grep -q -- "$pattern" "$tmp/err" || fail "$what: stderr lacks '$pattern': $(cat "$tmp/err")"
}
expect_usage "no model" "no model" --build "$bin"
expect_usage "rounds 0" "rounds 0 (1 to 100)" --build "$bin" --rounds 0 mlp
expect_usage "rounds not a number" "'x' is not a whole number" --build "$bin" --rounds x mlp
expect_usage "unknown option" "unknown option '--fast'" --build "$bin" --fast mlp
expect_usage "no binaries" "$tmp/pe-executord is missing" --build "$tmp" mlp
expect_usage "no model file" "model '$tmp/none'" --build "$bin" "$tmp/none"

# Every run fails (a batch of 0): exit 1, each named.
sh "$script" --build "$bin" --rounds 1 mlp --batch 0 >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc -eq 1 ] || fail "batch 0: exit $rc, want 1"
grep -q "round 1: daemon-defaults failed" "$tmp/err" || fail "batch 0: the defaults run not named"
grep -q "failed: daemon-defaults@1" "$tmp/err" || fail "batch 0: no list of the failed runs"

# A short real measurement: two rounds of a few steps.
if ! sh "$script" --build "$bin" --rounds 2 --json mlp --steps 6 >"$tmp/out" 2>"$tmp/err"; then
  fail "a short measurement failed:"
  cat "$tmp/err" >&2
  exit 1
fi
tail -n 1 "$tmp/out" >"$tmp/json"
cores=$(nproc 2>/dev/null || echo 1)
python3 - "$tmp/json" "$cores" "$tmp/out" <<'EOF' || status=1
import json, statistics, sys
j = json.load(open(sys.argv[1]))
cores = int(sys.argv[2])
table = open(sys.argv[3]).read()
bad = []
def check(cond, what):
    if not cond:
        bad.append(what)
want = ["daemon-defaults", "daemon-cpuN", "bench-seq1"]
if cores >= 2:
    want += ["bench-cpuN-sharded", "bench-cpuN-allreduce", "bench-cpuN-reduce", "bench-seqN"]
sps = j["samples_per_sec"]
check(j["bench"] == "defaults" and j["model"] == "mlp", "bench and model: %r" % j)
check(j["rounds"] == 2 and j["cores"] == cores, "rounds/cores: %r %r" % (j["rounds"], j["cores"]))
check(sorted(sps) == sorted(want), "settings %s, want %s" % (sorted(sps), sorted(want)))
for name, v in sps.items():
    check(len(v) == 2 and all(x > 0 for x in v), "%s: %r" % (name, v))
    check(name in table, "%s missing from the table" % name)
def recompute(a, b):
    return [x / y for x, y in zip(a, b)]
best = [max(sps[n][r] for n in sps if n != "daemon-defaults") for r in range(2)]
expect = {"defaults/best": recompute(sps["daemon-defaults"], best),
          "defaults/seq1": recompute(sps["daemon-defaults"], sps["bench-seq1"])}
if cores >= 2:
    expect["daemon/bench"] = recompute(sps["daemon-cpuN"], sps["bench-cpuN-sharded"])
for name, vals in expect.items():
    got = j["ratios"][name]
    check(len(got["rounds"]) == 2, "%s: rounds %r" % (name, got["rounds"]))
    for g, e in zip(got["rounds"], vals):
        check(abs(g - e) <= 1e-3 * e, "%s: %r, recomputed %r" % (name, got["rounds"], vals))
    check(abs(got["median"] - statistics.median(vals)) <= 1e-3 * max(vals),
          "%s: median %r of %r" % (name, got["median"], vals))
    check(abs(got["smallest"] - min(vals)) <= 1e-3 * max(vals),
          "%s: smallest %r of %r" % (name, got["smallest"], vals))
trial = j["places_trial"]
check(isinstance(trial, dict) and trial.get("places", "").startswith("cpu:") and
      trial.get("remembered") is False, "places_trial: %r" % trial)
for b in bad:
    print("FAIL:", b, file=sys.stderr)
sys.exit(1 if bad else 0)
EOF
exit $status
