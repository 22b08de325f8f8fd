#!/bin/sh
# gpu_verify.sh: the CUDA backend's verification, run on a lent GPU machine from a kit
# that `./pe gpu-kit` built on a development machine (the GPU machine has the
# CUDA driver and, in its Python packages, cudart/cuBLAS/cuDNN/NCCL 13, but
# none of our other libraries and no network, so nothing is built there).
#
#   sh .gpukit/gpu_verify.sh [STAGE...]   stages: env tests bench daemon memcheck
#                                         (default: these five, in that order),
#                                         trace, compare, graph, kernels (on request;
#                                         `env graph`: captured steps in one call)
#
# Every stage writes its log under $OUT (the device tool's return folder;
# /tmp/pe-gpu-out elsewhere) and a line to $OUT/summary.txt. Each command has
# its own time limit, cut to what is left of PE_GPU_BUDGET seconds (default
# 560), so that the whole run ends inside one 10-minute call; a suite of
# the tests stage gets at most PE_GPU_TEST_LIMIT seconds (default 240).
# The exit status is non-zero when a test or run failed. A suite that skips
# (exit 77: it sees fewer GPUs than it needs) fails too where nvidia-smi
# lists a GPU, since then the runtime could not reach it (driver too old for
# the kit's CUDA, libcuda missing); only test_cuda_nccl, test_cuda_nccl_nodes
# and test_cuda_job_nodes, which need two, may skip on a one-GPU machine. The
# stages fit one call together only when everything is quick: on a first
# run, make separate calls
# (`env tests`, `bench`, `daemon`, `memcheck`).
set -u

KIT=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/pe-gpu-out}
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
WORK=${PE_GPU_WORK:-/tmp/pe-gpu-kit}
failed=0
DEADLINE=$(($(date +%s) + ${PE_GPU_BUDGET:-560}))

note() { printf '%s\n' "$*" | tee -a "$SUMMARY"; }

# run_logged NAME LIMIT_S CMD...: run CMD with a time limit, stdout+stderr to
# $OUT/NAME.log, one summary line with its exit status and wall time.
run_logged() {
  name=$1 limit=$2
  shift 2
  t0=$(date +%s)
  left=$((DEADLINE - t0))
  if [ $left -lt 5 ]; then
    note "$name: NOT RUN, the budget (PE_GPU_BUDGET) is spent"
    failed=1
    return 1
  fi
  [ $limit -gt $left ] && limit=$left
  timeout -k 10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  dt=$(($(date +%s) - t0))
  case $rc in
    0) verdict=passed ;;
    77)
      if [ "${may_skip:-1}" = 1 ]; then
        verdict=skipped
      else
        verdict="SKIPPED on a machine with $(gpu_count) GPU(s): the runtime cannot see them" failed=1
      fi
      ;;
    124 | 137) verdict="TIMED OUT after ${limit}s" failed=1 ;;
    *) verdict="FAILED (exit $rc)" failed=1 ;;
  esac
  note "$name: $verdict, ${dt}s"
  return $rc
}

# GPUs that nvidia-smi lists (0 without a driver).
gpu_count() {
  nvidia-smi -L 2>/dev/null | grep -c '^GPU '
}

# The kit's binaries and non-CUDA libraries, unpacked once per kit: a warm
# machine keeps $WORK between calls, and a kit packed again after a change
# must replace the old binaries (its checksum is kept beside them).
unpack() {
  sum=$(cksum <"$KIT/kit.tar.xz")
  [ -x "$WORK/bin/pe-bench" ] && [ "$(cat "$WORK/.kit-sum" 2>/dev/null)" = "$sum" ] && return 0
  rm -rf "$WORK"
  mkdir -p "$WORK"
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
    "$KIT/kit.tar.xz" "$WORK" || {
    note "kit: cannot unpack $KIT/kit.tar.xz"
    exit 1
  }
  printf '%s' "$sum" >"$WORK/.kit-sum"
}

# CUDA's libraries come from the machine: the CUDA toolkit's directories and
# the nvidia-* Python wheels (PyTorch's). Each directory that holds one of
# the sonames the kit's binaries need goes onto LD_LIBRARY_PATH.
cuda_lib_path() {
  roots="/usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib
    /usr/lib/x86_64-linux-gnu"
  roots="$roots $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null)"
  dirs=""
  for so in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 libnccl.so.2; do
    found=""
    for r in $roots; do
      [ -d "$r" ] || continue
      found=$(find "$r" -name "$so" 2>/dev/null | head -n 1)
      [ -n "$found" ] && break
    done
    if [ -z "$found" ]; then
      note "env: $so not found on this machine (searched: $roots)"
      continue
    fi
    d=$(dirname "$found")
    case ":$dirs:" in *":$d:"*) ;; *) dirs="$dirs:$d" ;; esac
  done
  printf '%s' "${dirs#:}"
}

# The kit's libraries that this machine lacks (ldconfig's cache): a system
# library that is there (libstdc++, libz, ...) is likely newer than the kit's
# and may be what CUDA's own libraries need. PE_GPU_KIT_LIBS=all takes every
# library from the kit instead.
kit_lib_path() {
  use="$WORK/lib-use"
  rm -rf "$use"
  mkdir -p "$use"
  cache=$(ldconfig -p 2>/dev/null)
  for f in "$WORK"/lib/*; do
    so=$(basename "$f")
    if [ "${PE_GPU_KIT_LIBS:-missing}" = all ] ||
      ! printf '%s\n' "$cache" | grep -q "^[[:space:]]*$so "; then
      ln -sf "$f" "$use/$so"
    fi
  done
  printf '%s' "$use"
}

setup() {
  unpack
  LD_LIBRARY_PATH="$(kit_lib_path):$(cuda_lib_path)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export LD_LIBRARY_PATH
  export PE_FASHION_MNIST_DIR="$KIT/data"
  export OMP_WAIT_POLICY=passive
  BIN="$WORK/bin"
}

stage_env() {
  {
    echo "kit: $(cat "$WORK/MANIFEST" 2>/dev/null)"
    uname -a
    nvidia-smi 2>&1
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    echo "from the kit: $(ls "$WORK/lib-use" | tr '\n' ' ')"
  } >"$OUT/env.log" 2>&1
  for b in "$BIN"/*; do
    echo "== ldd $(basename "$b")"
    ldd "$b" 2>&1
  done >"$OUT/ldd.log"
  if grep -q 'not found' "$OUT/ldd.log"; then
    note "env: a library is missing (see ldd.log):"
    grep 'not found' "$OUT/ldd.log" | sort -u | tee -a "$SUMMARY"
    failed=1
  else
    note "env: every library resolved; GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total \
      --format=csv,noheader 2>&1 | head -n 1)"
  fi
}

# The suites of tests/cuda in the order of docs/cuda.md's table; test_cuda_nccl,
# test_cuda_nccl_nodes and test_cuda_job_nodes need two GPUs and skip on one
# (test_cuda_job_nodes starts the kit's pe-executord: PE_BUILD_DIR=$BIN).
stage_tests() {
  n=$(gpu_count)
  for t in test_cuda_build test_cuda_device test_cuda_kernels test_cuda_ops_seq test_cuda_train \
    test_cuda_graph test_cuda_graph_exec test_cuda_nccl_nodes_init test_cuda_nccl \
    test_cuda_nccl_nodes test_cuda_job_nodes; do
    may_skip=1
    case "$t" in test_cuda_nccl | test_cuda_nccl_nodes | test_cuda_job_nodes) ;;
      *) [ "$n" -ge 1 ] && may_skip=0 ;;
    esac
    [ "$n" -ge 2 ] && may_skip=0
    run_logged "$t" "${PE_GPU_TEST_LIMIT:-240}" env PE_BUILD_DIR="$BIN" "$BIN/$t"
    tail -n 3 "$OUT/$t.log" 2>/dev/null | sed 's/^/    /' | tee -a "$SUMMARY"
  done
  may_skip=1
}

# The issue's two benchmark lines, then both sync strategies of the MLP.
stage_bench() {
  : >"$OUT/bench.jsonl"
  for args in "--model mlp --places cuda:0" "--model cnn --places cuda:0" \
    "--model mlp --places cuda:0 --sync producer" "--model mlp --places cuda:0 --prefetch off"; do
    name="bench_$(printf '%s' "$args" | tr -c 'a-z0-9' '_' | tr -s _)"
    # shellcheck disable=SC2086
    if run_logged "$name" 300 "$BIN/pe-bench" train $args --json; then
      tail -n 1 "$OUT/$name.log" | tee -a "$OUT/bench.jsonl" "$SUMMARY"
    else
      tail -n 5 "$OUT/$name.log" | sed 's/^/    /' | tee -a "$SUMMARY"
    fi
  done
}

# Captured steps (docs/cuda.md, "Captured steps") in one call: the two
# suites, then pe-bench with --cuda-graph on and off for the MLP, the CNN
# and conf/models/resnet (PE_GPU_GRAPH_STEPS steps, 300; graph.jsonl: the
# on/off pairs, with cuda_graph_steps saying how many steps replayed), then
# the compare stage (pe-bench beside PyTorch on the GPU) with captured steps
# on.
stage_graph() {
  n=$(gpu_count)
  [ "$n" -ge 1 ] && may_skip=0
  for t in test_cuda_graph test_cuda_graph_exec; do
    run_logged "graph_$t" "${PE_GPU_TEST_LIMIT:-240}" "$BIN/$t"
    tail -n 3 "$OUT/graph_$t.log" 2>/dev/null | sed 's/^/    /' | tee -a "$SUMMARY"
  done
  may_skip=1
  : >"$OUT/graph.jsonl"
  st=${PE_GPU_GRAPH_STEPS:-300}
  for m in mlp cnn resnet; do
    pm=$m
    [ "$m" = resnet ] && pm="$KIT/compare/resnet"
    for cg in off on; do
      name="graph_bench_${m}_$cg"
      if run_logged "$name" 120 "$BIN/pe-bench" train --model "$pm" --places cuda:0 \
        --epochs 1 --steps "$st" --cuda-graph "$cg" --json; then
        tail -n 1 "$OUT/$name.log" | tee -a "$OUT/graph.jsonl" "$SUMMARY"
      else
        tail -n 5 "$OUT/$name.log" | sed 's/^/    /' | tee -a "$SUMMARY"
      fi
    done
  done
  for m in mlp cnn resnet; do
    check_graph_pair "$m"
  done
  PE_GPU_PE_ARGS="--cuda-graph on"
  stage_compare
  PE_GPU_PE_ARGS=
}

# graph_bench_M_on must have replayed its steps and trained as
# graph_bench_M_off did: the same final loss and test accuracy.
check_graph_pair() {
  off="$OUT/graph_bench_$1_off.log" on="$OUT/graph_bench_$1_on.log"
  if python3 - "$off" "$on" >>"$SUMMARY" 2>&1 <<'PY'; then
import json, sys
off, on = (json.loads(open(f).read().strip().splitlines()[-1]) for f in sys.argv[1:3])
g = on["cuda_graph_steps"]
bad = []
if not g["replayed"]:
    bad.append("no step replayed: " + g["reason"])
for k in ("final_loss", "test_accuracy"):
    if on[k] != off[k]:
        bad.append("%s %s with captured steps, %s without" % (k, on[k], off[k]))
print("    %s: %d captures, %d replays, %d fallbacks%s" % (
    on["model"], g["captures"], g["replays"], g["fallbacks"], "; " + "; ".join(bad) if bad else ""))
sys.exit(1 if bad else 0)
PY
    note "graph_check_$1: passed"
  else
    note "graph_check_$1: FAILED"
    failed=1
  fi
}

# The product's path: pe-executord with places auto (every GPU), pe-client
# training the MLP through it (captured steps off, then on), then SIGTERM (checkpoint, exit 0).
stage_daemon() {
  d=$(mktemp -d /tmp/pe-gpu-daemon.XXXXXX)
  sock="ipc://$d/pe.sock"
  "$BIN/pe-executord" --socket "$sock" --state-dir "$d/state" --places auto \
    --log-level info >"$OUT/daemon.log" 2>&1 &
  pid=$!
  tries=0
  until "$BIN/pe-client" --socket "$sock" --timeout 1000 ping >/dev/null 2>&1; do
    tries=$((tries + 1))
    if ! kill -0 "$pid" 2>/dev/null || [ $tries -ge 100 ]; then
      note "daemon: did not start (see daemon.log)"
      failed=1
      kill -KILL "$pid" 2>/dev/null
      return
    fi
    sleep 0.2
  done
  run_logged daemon_status 30 "$BIN/pe-client" --socket "$sock" status
  run_logged daemon_train 300 "$BIN/pe-client" --socket "$sock" --json train --model mlp \
    --epochs 1 --places cuda:0 --cuda-graph off --quiet &&
    tail -n 1 "$OUT/daemon_train.log" | tee -a "$SUMMARY"
  run_logged daemon_train_graph 300 "$BIN/pe-client" --socket "$sock" --json train --model mlp \
    --epochs 1 --places cuda:0 --cuda-graph on --model-name mlp-graph --quiet &&
    tail -n 1 "$OUT/daemon_train_graph.log" | tee -a "$SUMMARY"
  # The same training with and without captured steps: the same loss.
  if python3 - "$OUT/daemon_train.log" "$OUT/daemon_train_graph.log" >>"$SUMMARY" 2>&1 <<'PY'; then
import json, sys
a, b = (json.loads(open(f).read().strip().splitlines()[-1]) for f in sys.argv[1:3])
print("    final_loss %s without captured steps, %s with" % (a["final_loss"], b["final_loss"]))
sys.exit(0 if a["final_loss"] == b["final_loss"] else 1)
PY
    note "daemon_graph_check: passed"
  else
    note "daemon_graph_check: FAILED"
    failed=1
  fi
  kill -TERM "$pid"
  # A hang at shutdown must not eat the call: 60 s, then SIGKILL.
  t=0
  while kill -0 "$pid" 2>/dev/null && [ $t -lt 300 ]; do
    sleep 0.2
    t=$((t + 1))
  done
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid"
    note "daemon: still running 60 s after SIGTERM, killed"
  fi
  wait "$pid"
  drc=$?
  note "daemon: exit status $drc after SIGTERM"
  [ $drc -eq 0 ] || failed=1
  rm -rf "$d"
}

# The equivalence suite again with PE_EQ_TRACE (every step's loss and
# parameter differences) and the tolerance lifted (PE_CUDA_RTOL=1), to show
# how the differences from the CPU grow over the 20 steps.
stage_trace() {
  run_logged trace_test_cuda_train 120 env PE_EQ_TRACE=1 PE_CUDA_RTOL=1 "$BIN/test_cuda_train"
  grep -E 'step (1|2|5|10|15|20):|^par_equiv' "$OUT/trace_test_cuda_train.log" | sed 's/^/    /' |
    tee -a "$SUMMARY"
}

# pe-bench on cuda:0 beside PyTorch on the same GPU (bench/compare's
# torch_train.py --device cuda in its three loops, PE_GPU_TORCH_LOOPS, the
# machine's own torch), PE_GPU_EPOCHS
# epochs (1) of each model, alternating (compare.jsonl); resnet is the
# model file conf/models/resnet, as in ./pe compare. PE_GPU_BASELINE: the
# path of a pe-bench from another commit (carried beside the kit), run
# after each pe-bench for before/after figures on the same GPU.
stage_compare() {
  : >"$OUT/compare.jsonl"
  ep=${PE_GPU_EPOCHS:-1}
  for m in mlp cnn resnet; do
    pm=$m
    [ "$m" = resnet ] && pm="$KIT/compare/resnet"
    # shellcheck disable=SC2086
    run_logged "compare_pe_$m" 120 "$BIN/pe-bench" train --model "$pm" --places cuda:0 \
      --epochs "$ep" ${PE_GPU_PE_ARGS:-} --json &&
      tail -n 1 "$OUT/compare_pe_$m.log" | tee -a "$OUT/compare.jsonl" "$SUMMARY"
    if [ -n "${PE_GPU_BASELINE:-}" ]; then
      run_logged "compare_base_$m" 120 "$PE_GPU_BASELINE" train --model "$pm" --places cuda:0 \
        --epochs "$ep" --json &&
        tail -n 1 "$OUT/compare_base_$m.log" | sed 's/^{/{"baseline":true,/' |
        tee -a "$OUT/compare.jsonl" "$SUMMARY"
    fi
    for loop in ${PE_GPU_TORCH_LOOPS:-sync nosync graph}; do
      run_logged "compare_torch_${m}_$loop" 120 python3 "$KIT/compare/torch_train.py" \
        --model "$m" --device cuda --loop "$loop" --epochs "$ep" --data "$KIT/data" &&
        tail -n 1 "$OUT/compare_torch_${m}_$loop.log" | tee -a "$OUT/compare.jsonl" "$SUMMARY"
    done
  done
}

# Each kernel's GPU time (bench/gpu/kernel_times.c, CUPTI) in PE_GPU_GRAPH_STEPS
# steps (300) of pe-bench with captured steps, and in PyTorch's captured
# loop for 1 epoch, for the MLP, the CNN and the resnet: kernels_pe_M.txt and
# kernels_torch_M.txt, the largest totals first (the evaluation's kernels
# are included).
stage_kernels() {
  lib="$BIN/libpe-kernel-times.so"
  for m in mlp cnn resnet; do
    pm=$m
    [ "$m" = resnet ] && pm="$KIT/compare/resnet"
    run_logged "kernels_pe_$m" 120 env LD_PRELOAD="$lib" PE_KERNEL_TIMES="$OUT/kernels_pe_$m.txt" \
      "$BIN/pe-bench" train --model "$pm" --places cuda:0 --epochs 1 \
      --steps "${PE_GPU_GRAPH_STEPS:-300}" --cuda-graph on --json
    head -n 12 "$OUT/kernels_pe_$m.txt" 2>/dev/null | sed 's/^/    /' | tee -a "$SUMMARY"
    run_logged "kernels_torch_$m" 120 env LD_PRELOAD="$lib" \
      PE_KERNEL_TIMES="$OUT/kernels_torch_$m.txt" python3 "$KIT/compare/torch_train.py" \
      --model "$m" --device cuda --loop graph --epochs 1 --data "$KIT/data"
    head -n 12 "$OUT/kernels_torch_$m.txt" 2>/dev/null | sed 's/^/    /' | tee -a "$SUMMARY"
  done
}

# compute-sanitizer's memcheck over the kernel suites and the training one: an
# out-of-bounds or misaligned access in a kernel that the comparisons with
# the CPU happen not to show.
stage_memcheck() {
  cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
  if [ -z "$cs" ]; then
    note "memcheck: compute-sanitizer not found, not run"
    return
  fi
  for t in test_cuda_kernels test_cuda_ops_seq test_cuda_train; do
    run_logged "memcheck_$t" 300 "$cs" --tool memcheck --error-exitcode 9 "$BIN/$t"
    grep -E 'ERROR SUMMARY|Invalid' "$OUT/memcheck_$t.log" | head -n 5 | sed 's/^/    /' |
      tee -a "$SUMMARY"
  done
}

setup
stages=${*:-env tests bench daemon memcheck}
for s in $stages; do
  case $s in
    env | tests | bench | daemon | memcheck | trace | compare | graph | kernels) "stage_$s" ;;
    *) note "unknown stage '$s' (env tests bench daemon memcheck trace compare graph kernels)"; failed=1 ;;
  esac
done
note "gpu_verify: $([ $failed -eq 0 ] && echo 'all passed' || echo 'FAILURES, see above')"
exit $failed
