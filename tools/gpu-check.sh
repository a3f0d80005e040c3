#!/usr/bin/env bash
# gpu-check.sh: the one prepared run for a GPU machine (docs/cuda.md, "Ordering a receiver after its
# sender"; docs/benchmarks.md has what earlier runs showed). From the project root, on the GPU
# machine, with .kit sent along (made here first by `bash ../shared/gpu/make-kit.sh`):
#
#   bash tools/gpu-check.sh            # about 8 minutes on 16 cores
#
# In order of what matters most, each step within what is left of FERRY_GPU_CHECK_BUDGET_S (480):
#   build      .kit/device-check.sh build: LibTorch from the machine's PyTorch, CUDA on
#   sync       ferry-cuda-sync-bench: each CUDA call of each way of ordering, the round trips
#              with their ordering check, a dead sender's pending writes
#   gpu        the GPU tests (not the benchmarks') under FERRY_CUDA_SYNC=auto, memop, event, stream;
#              among them what a receiver sees of a CUDA message whose sender was SIGKILLed
#              before it was taken (peer_dead with the remedy, the queue working on: cuda.md)
#   bench      ferry-cuda-bench --breakdown under each FERRY_CUDA_SYNC value, then with
#              PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (chunks passed by fd)
#   sanitizer  compute-sanitizer memcheck, then synccheck, on each CUDA test case
# A step that would not fit is SKIPped, naming the command that reruns it. Only 8 files come back
# from a GPU machine, so the logs are packed into these, in $OUT (else /tmp/ferry-gpu-check):
#   summary.txt  one PASS/FAIL/SKIP line per step and what it found
#   build.log    the kit's environment and build
#   sync.log  sync.json          ferry-cuda-sync-bench's table and figures
#   gpu.log      the GPU tests, every mode
#   bench.log    ferry-cuda-bench's tables, every mode;  bench.tar.gz  their JSON
#   sanitizer.log
# It exits 1 when a step failed. Options: --no-build with FERRY_KIT_BUILD=DIR checks an existing
# build (as on a machine without a GPU, where every GPU step SKIPs: how this script is tested).
set -uo pipefail

t_start=$(date +%s)
budget=${FERRY_GPU_CHECK_BUDGET_S:-480}
out=${OUT:-/tmp/ferry-gpu-check}
build=${FERRY_KIT_BUILD:-/tmp/ferry-gpu-build}
jobs=$(nproc)
modes=(auto memop event stream)
do_build=1
[ "${1:-}" = --no-build ] && do_build=0

die() { echo "gpu-check: error: $*" >&2; exit 2; }
[ -f CMakeLists.txt ] && grep -q 'project(ferry' CMakeLists.txt || die "run it from ferry's project root"
if [ $do_build = 1 ]; then
  [ -f .kit/device-check.sh ] ||
    die "no .kit/device-check.sh: run 'bash ../shared/gpu/make-kit.sh' on the developer machine, and send .kit along"
fi
mkdir -p "$out" || die "cannot make $out"
work=$(mktemp -d) || die "mktemp"
trap 'rm -rf "$work"' EXIT
summary=$out/summary.txt
: >"$summary"

elapsed() { echo $(($(date +%s) - t_start)); }
left() { echo $((budget - $(elapsed))); }
declare -A result
record() { # step status seconds note
  local line
  line=$(printf '%-10s %-4s %4ss  %s' "$1" "$2" "$3" "$4")
  result[$1]=$2
  echo "$line" >>"$summary"
  echo "---- $line"
}
# Runs `step_NAME SECONDS` when at least `need` seconds are left, recording how it went.
run_step() { # name need cap
  local name=$1 need=$2 cap=$3 t rc t0
  t=$(left)
  [ "$t" -gt "$cap" ] && t=$cap
  if [ "$t" -lt "$need" ]; then
    record "$name" SKIP 0 "not enough time left (${t}s); rerun: bash tools/gpu-check.sh --no-build (it redoes every step)"
    return
  fi
  printf '\n======== %s (%ss at most)\n' "$name" "$t"
  note=""
  t0=$(date +%s)
  "step_$name" "$t"
  rc=$?
  case $rc in
    0) record "$name" PASS $(($(date +%s) - t0)) "$note" ;;
    3) record "$name" SKIP $(($(date +%s) - t0)) "$note" ;;
    *) record "$name" FAIL $(($(date +%s) - t0)) "$note" ;;
  esac
}

gpu=""
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  gpu=$(nvidia-smi -L | head -n 1 | sed 's/ (UUID.*//')
fi

step_build() { # seconds
  local kit_out=$work/kit rc
  mkdir -p "$kit_out"
  OUT=$kit_out FERRY_KIT_BUILD=$build FERRY_KIT_BUDGET_S=$1 bash .kit/device-check.sh build \
    >"$work/build-run.log" 2>&1
  rc=$?
  cat "$kit_out/env.log" "$work/build-run.log" "$kit_out/build.log" >"$out/build.log" 2>/dev/null
  note=$(sed -n 's/^build *[A-Z]* *[0-9]*s *//p' "$kit_out/summary.txt" 2>/dev/null | head -n 1)
  tail -n 5 "$work/build-run.log"
  [ $rc -eq 0 ]
}

step_sync() { # seconds
  local bin=$build/test/bench/ferry-cuda-sync-bench rc
  [ -x "$bin" ] || { note="no ferry-cuda-sync-bench in the build (no nvcc?)"; return 1; }
  timeout -k 10 "$1" "$bin" --json "$out/sync.json" >"$out/sync.log" 2>&1
  rc=$?
  tail -n 8 "$out/sync.log"
  if grep -q '^skipped:' "$out/sync.log"; then
    note=$(grep -m 1 '^skipped:' "$out/sync.log")
    return 3
  fi
  note=$(grep -m 1 '^ordering check:' "$out/sync.log")
  note="${note:-no ordering check printed}; $(grep -m 1 '^dead sender:' "$out/sync.log")"
  [ $rc -ne 0 ] && note="exit $rc: $note"
  [ $rc -eq 0 ]
}

step_gpu() { # seconds
  local per=$(($1 / ${#modes[@]})) mode rc bad=0 skipped=0 notes=()
  : >"$out/gpu.log"
  for mode in "${modes[@]}"; do
    printf '\n======== FERRY_CUDA_SYNC=%s ctest -L gpu\n' "$mode" >>"$out/gpu.log"
    # The benchmarks' smoke tests have a step of their own (and ferry-cuda-sync-bench ignores
    # FERRY_CUDA_SYNC): not four times here.
    (cd "$build" && FERRY_CUDA_SYNC=$mode timeout -k 10 "$per" ctest --output-on-failure \
      -j "$jobs" --timeout 300 -L gpu -LE bench) >>"$out/gpu.log" 2>&1
    rc=$?
    local summary_line
    summary_line=$(grep -E 'tests passed, ' "$out/gpu.log" | tail -n 1)
    local s
    s=$(sed -n '/FERRY_CUDA_SYNC='"$mode"' /,$p' "$out/gpu.log" | grep -c -E '\*\*\*Skipped')
    notes+=("$mode: ${summary_line:-no summary (exit $rc)}")
    [ $rc -eq 0 ] || bad=$((bad + 1))
    skipped=$((skipped + s))
  done
  note=$(IFS=';'; echo "${notes[*]}")
  echo "$note"
  [ $bad -eq 0 ] || return 1
  if [ -z "$gpu" ]; then
    note="no GPU here; $note"
    return 3
  fi
  # On a GPU machine a GPU test that skips did not run: a failure of the check.
  [ $skipped -eq 0 ] || { note="$skipped skips on a GPU machine; $note"; return 1; }
}

step_bench() { # seconds
  local bin=$build/test/bench/ferry-cuda-bench py run per rc bad=0 name
  [ -x "$bin" ] || { note="no ferry-cuda-bench in the build"; return 1; }
  py=$(command -v /opt/torch/.venv/bin/python3 python3 2>/dev/null | head -n 1)
  local runs=("${modes[@]}" expandable)
  per=$(($1 / ${#runs[@]}))
  mkdir -p "$work/bench"
  : >"$out/bench.log"
  for run in "${runs[@]}"; do
    name=$run
    local env=(FERRY_CUDA_SYNC=$run)
    [ "$run" = expandable ] && env=(FERRY_CUDA_SYNC=auto PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)
    printf '\n======== %s ferry-cuda-bench --breakdown\n' "${env[*]}" >>"$out/bench.log"
    env "${env[@]}" timeout -k 10 "$per" "$bin" --breakdown ${py:+--python "$py"} \
      --json "$work/bench/cuda-bench-$name.json" >>"$out/bench.log" 2>&1
    rc=$?
    [ $rc -eq 0 ] || { bad=$((bad + 1)); echo "$name: exit $rc" >>"$out/bench.log"; }
  done
  tar -czf "$out/bench.tar.gz" -C "$work" bench
  if grep -q '^ferry-cuda-bench: skipped' "$out/bench.log"; then
    note=$(grep -m 1 '^ferry-cuda-bench: skipped' "$out/bench.log")
    return 3
  fi
  note="$(grep -c 'hand-off round trip' "$out/bench.log") tables; p50 per mode: $(grep -E 'hand-off round trip, 1 MiB.*p50' "$out/bench.log" | awk '{print $(NF-4)}' | tr '\n' ' ')"
  [ $bad -eq 0 ]
}

# Test case names of a Catch2 binary, one a line (Catch2 2's flag, else 3's).
list_cases() {
  local names
  names=$("$1" --list-test-names-only 2>/dev/null | grep -v '^$')
  [ -n "$names" ] || names=$("$1" --list-tests --verbosity quiet 2>/dev/null | grep -v '^$')
  printf '%s\n' "$names"
}

step_sanitizer() { # seconds
  local bin=$build/test/cuda_tests sanitizer tool name spec rc deadline left ok=0 bad=0 notrun=0
  sanitizer=$(command -v compute-sanitizer 2>/dev/null || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
  [ -n "$gpu" ] || { note="no GPU"; return 3; }
  [ -n "$sanitizer" ] || { note="compute-sanitizer not found"; return 3; }
  [ -x "$bin" ] || { note="no cuda_tests in the build"; return 1; }
  deadline=$(($(date +%s) + $1))
  : >"$out/sanitizer.log"
  for tool in memcheck synccheck; do
    # One process per case, as ctest runs them: the tests fork peers that use CUDA.
    while IFS= read -r name; do
      [ -n "$name" ] || continue
      left=$((deadline - $(date +%s)))
      if [ "$left" -lt 15 ]; then
        notrun=$((notrun + 1))
        echo "not run (out of time) $tool: $name" >>"$out/sanitizer.log"
        continue
      fi
      [ "$left" -gt 120 ] && left=120
      spec=${name//,/\\,}
      spec=${spec//[/\\[}
      printf '\n======== %s: %s\n' "$tool" "$name" >>"$out/sanitizer.log"
      timeout -k 10 "$left" "$sanitizer" --tool "$tool" --target-processes all \
        --error-exitcode 86 --print-limit 20 "$bin" "$spec" >>"$out/sanitizer.log" 2>&1
      rc=$?
      case $rc in
        0 | 77) ok=$((ok + 1)); echo "ok       $tool: $name" ;;
        86) bad=$((bad + 1)); echo "ERRORS   $tool: $name" ;;
        *) bad=$((bad + 1)); echo "FAILED   $tool: $name (exit $rc)" ;;
      esac | tee -a "$out/sanitizer.log"
    done < <(list_cases "$bin")
  done
  note="memcheck and synccheck: $ok clean, $bad with errors or failures, $notrun not run"
  [ $bad -eq 0 ] && [ $notrun -eq 0 ]
}

{
  echo "gpu-check: ${gpu:-no GPU}; $(uname -srm), $jobs cores; budget ${budget}s; build $build"
  [ -n "$gpu" ] && nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader
} | tee -a "$summary"
if [ $do_build = 1 ]; then
  run_step build 60 240
else
  [ -f "$build/CMakeCache.txt" ] || die "--no-build, but $build holds no build"
  record build SKIP 0 "--no-build: $build as it is"
  result[build]=PASS
fi
if [ "${result[build]}" = PASS ]; then
  run_step sync 30 150
  run_step gpu 40 160
  run_step bench 40 150
  run_step sanitizer 60 200
else
  for s in sync gpu bench sanitizer; do record "$s" SKIP 0 "the build failed (build.log)"; done
fi
echo "${gpu:-no GPU}; $(elapsed)s in all; files: $(cd "$out" && ls | tr '\n' ' ')" | tee -a "$summary"
[ "$(ls "$out" | wc -l)" -le 8 ] || echo "gpu-check: warning: more than 8 files in $out: some will not come back" | tee -a "$summary"
for s in build sync gpu bench sanitizer; do [ "${result[$s]:-}" = FAIL ] && exit 1; done
exit 0
