#!/usr/bin/env bash
# One prepared GPU call (about 8 minutes; a device session has 15 minutes, 2-4 of them to start the
# machine, and at most 10 per command). Beside check.sh, whose wheels it uses. From the project root:
#   on the CPU machine:  bash scripts/gpu/session.sh prepare   (prepare.sh's wheels + einops, for fla-core)
#   on the GPU machine:  bash scripts/gpu/session.sh           (carry .gpu; OUT is where results go;
#                        give the call a limit of about 560 s: 480 s of parts, wheels, start-up)
#   a dry run here:      GPU_SESSION_DRY=1 OUT=/tmp/session bash scripts/gpu/session.sh
# Parts, each under its own time limit:
#   (b) benchmarks/bench_kernels.py --device cuda, alone on the GPU (its times must not share it):
#       KERNELS_TIMEOUT=150 s -> $OUT/results/cuda/kernels.json (saved after every kernel), kernels.log
#   then, side by side (neither measures time):
#   (a) pytest -m gpu over tests/: TESTS_TIMEOUT=150 s -> $OUT/pytest_gpu.log
#   (c) the arena protocol at the GPU preset, ARENA_PROCS=8 processes on the one GPU, resumed from
#       benchmarks/results/cuda/arena_protocol.json when the project holds one: ARENA_TIMEOUT=330 s
#       -> $OUT/results/cuda/arena_protocol.json (rewritten after every finished run), arena.log.
#       Copy that file back to benchmarks/results/cuda/ and commit it: the next session resumes it.
#   Wall: 150 + max(150, 330) = 480 s = 8 min, plus about 15 s to install two wheels.
#
# How many arena runs fit. PRESETS["gpu"]: pairs 8,16,32,64 at width 64; widths 32,64,128,256 at 32
# pairs; learning rates 3e-4,1e-3,3e-3,1e-2; seeds 0,1,2; 9 families; 2000 steps of batch 64.
#   pairs axis        4 pairs x 4 lr x 9 families                          = 144
#   GLA gate arm      4 pairs x 4 lr                                       =  16
#   seeds at (32,64)  3 seeds x 4 lr x 9 - 36 shared with the pairs axis   =  72
#   widths at 32      4 widths x 4 lr x 9 - 36 shared (width 64)           = 108
#   total                                                                    340 runs (protocol_grid)
# Time per run (an estimate, not measured on a GPU): these models are tiny for an H100, so a step costs
# about what the CPU needs to issue its operations. One training step (forward, backward, AdamW) at width
# 8, batch 2 (no real compute) took 17-44 ms per family on the shared 2-core CPU at load ~7 (softmax 17,
# GLA 32, Mamba 42, H3 44; mean 34): say 3x less on an idle core, ~10 ms per step with the launches, so
# 2000 steps + evaluation ~ 20 s per run in one process. 8 processes on 16 cores share the GPU, which
# idles between launches: assume ~4x one process. Worker start ~20 s. So (330 - 20) s x 4 / 20 s ~ 60 runs
# per session (fewer while the tests run beside it): 340 / 60 ~ 6 sessions for the whole GPU protocol
# (2x off either way: 3 to 12). The first session's summary line (median seconds per run) corrects it.
set -u
export PYTHONUNBUFFERED=1
root=$PWD
OUT=${OUT:-/tmp/gpu-session}; mkdir -p "$OUT/results/cuda"
if [[ ${1:-} == prepare ]]; then
  bash scripts/gpu/prepare.sh
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform any -d .gpu/whl einops==0.8.2
  exit
fi
DRY=${GPU_SESSION_DRY:-}
PY=${PYTHON:-python3}; site=${SITE:-/tmp/site}     # the Python with torch; where the wheels go
if [[ -n $DRY ]]; then        # CPU: each part at tiny settings, the same commands and files
  device=cpu; export XFAM_GPU_TESTS_ON=cpu
  tests=(tests/test_gpu.py -k rope); arena=(--families softmax gla --protocol-steps 2
    --protocol-lrs 1e-3 --protocol-seeds 0 --procs 2)
  : "${KERNELS_TIMEOUT:=90}" "${TESTS_TIMEOUT:=120}" "${ARENA_TIMEOUT:=120}"
else
  device=cuda; tests=(tests); arena=(--procs "${ARENA_PROCS:-8}")
  wheels=$(ls .gpu/whl/fla_core-*.whl .gpu/whl/einops-*.whl 2>/dev/null)
  if [[ $wheels == *fla_core* ]]; then      # einops: from the wheel, or the image's own
    # shellcheck disable=SC2086
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" $wheels \
      >/dev/null 2>&1 || echo "fla-core wheel install failed"
  else
    echo "no .gpu/whl (run 'bash scripts/gpu/session.sh prepare' and carry .gpu): fla-core is left out"
  fi
  export PYTHONPATH=$site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$root:$root/exercises XFAM_BENCH_RESULTS=$OUT/results
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | head -3
  $PY -c 'import torch, sys; print(sys.version.split()[0], torch.__version__, torch.cuda.is_available())'
  $PY -c 'import triton; print("triton", triton.__version__)' 2>&1 | tail -1
  $PY -c 'import fla; print("fla-core", fla.__version__)' 2>&1 | tail -1; } > "$OUT/env.txt"
cat "$OUT/env.txt"
SECONDS=0

echo "=== (b) bench_kernels.py on $device (limit ${KERNELS_TIMEOUT:=150} s)"
timeout -k 10 "$KERNELS_TIMEOUT" $PY benchmarks/bench_kernels.py --device $device \
  ${DRY:+--dry-run-out "$OUT/results/kernels_dry_run.json"} > "$OUT/kernels.log" 2>&1
echo "rc=$? at ${SECONDS}s"; grep -E "^===|(OK|MISSED)$|not correct|correct$|error" "$OUT/kernels.log" | cut -c1-200

echo "=== (a) pytest -m gpu (limit ${TESTS_TIMEOUT:=150} s) beside (c) the arena protocol (limit ${ARENA_TIMEOUT:=330} s)"
if [[ -n $DRY ]]; then
  arena_out=$OUT/results/arena_protocol_dry_run.json
else                          # continue the sweep the project holds
  arena_out=$OUT/results/cuda/arena_protocol.json
  [[ -f benchmarks/results/cuda/arena_protocol.json && ! -f $arena_out ]] \
    && cp benchmarks/results/cuda/arena_protocol.json "$arena_out"
fi
OMP_NUM_THREADS=1 timeout -k 10 "$ARENA_TIMEOUT" $PY benchmarks/arena_sweep.py --protocol --resume \
  --device $device --threads 1 "${arena[@]}" --out "$arena_out" > "$OUT/arena.log" 2>&1 &
arena_pid=$!
timeout -k 10 "$TESTS_TIMEOUT" $PY -m pytest "${tests[@]}" -m gpu -q -p no:cacheprovider -rfE \
  > "$OUT/pytest_gpu.log" 2>&1
echo "pytest rc=$? at ${SECONDS}s"; grep -E "^(FAILED|ERROR)" "$OUT/pytest_gpu.log" | cut -c1-300
tail -1 "$OUT/pytest_gpu.log"
wait $arena_pid
rc=$?; echo "arena rc=$rc at ${SECONDS}s"
[[ $rc == 124 ]] && echo "  stopped by its time limit; every finished run is saved"
grep -E "^resuming|^wrote" "$OUT/arena.log"; grep -E "^[0-9]+/[0-9]+ " "$OUT/arena.log" | tail -2
[[ -f $arena_out ]] && $PY - "$arena_out" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
walls = [r["wall_s"] for r in d["runs"]]
print(f"arena: {len(d['runs'])}/{d['n_runs']} runs saved, complete={d['complete']}, "
      f"median {sorted(walls)[len(walls) // 2] if walls else float('nan'):.1f} s per run, "
      f"this call {d['wall_time_s']:.0f} s")
EOF
ls -l "$OUT" "$OUT/results" "$OUT/results/cuda"
