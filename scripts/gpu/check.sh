#!/usr/bin/env bash
# The project on a CUDA GPU: the `gpu` tests, the library suite, and every chapter, exercise master
# and student notebook executed alone (as on Colab) at the GPU size preset; about 7 minutes on an H100.
# Prepared by scripts/gpu/prepare.sh; run on the GPU machine from the project root:
#   bash .gpu/check.sh [bench] [tests] [notebooks]      (default: tests notebooks; bench on its own)
# Results under $OUT: env.txt, pytest_gpu.log, pytest_all.log, notebooks.json + notebooks.log,
# executed.tar.gz (the executed notebooks), gpu_bench.json + bench.log.
set -u
export PYTHONUNBUFFERED=1
root=$PWD
OUT=${OUT:-/tmp/gpu-check}; mkdir -p "$OUT"
parts=${*:-tests notebooks}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl \
  >/dev/null 2>&1 || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=/tmp/site:$root:$root/exercises
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c 'import torch, sys; print(sys.version.split()[0], torch.__version__, torch.cuda.is_available())'; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
SECONDS=0
if [[ $parts == *bench* ]]; then
  echo "=== bench (GPU ratios; cases: CASES=attention,linear_attention,gla,ssd,selective_scan)"
  (mkdir -p /tmp/bench && cd /tmp/bench && ln -sfn "$root" proj && timeout 240 python3 "$root/.gpu/gpu_bench.py" > "$OUT/bench.log" 2>&1)
  echo "bench rc=$? at ${SECONDS}s"; grep -E '"error"|^#' "$OUT/bench.log" | cut -c1-300
fi
if [[ $parts == *tests* ]]; then
  echo "=== pytest -m gpu"
  timeout 150 python3 -m pytest tests -m gpu -q -p no:cacheprovider -rfE > "$OUT/pytest_gpu.log" 2>&1
  echo "rc=$? at ${SECONDS}s"; grep -E "^(FAILED|ERROR)" "$OUT/pytest_gpu.log" | cut -c1-400; tail -2 "$OUT/pytest_gpu.log"
fi
if [[ $parts == *notebooks* ]]; then
  echo "=== chapters, exercise masters and student notebooks alone (as on Colab), GPU size preset;"
  echo "    the library suite beside them"
  notebooks=${NOTEBOOKS:-"chapters/*.ipynb exercises/ch*/ch*_exercises.ipynb exercises/ch*/student/ch*_exercises.ipynb"}
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=1 NB_TOTAL_TIMEOUT=${NB_TOTAL_TIMEOUT:-300} timeout ${NB_ALL_TIMEOUT:-330} \
    python3 .gpu/run_notebooks.py "$OUT" ${NB_PARALLEL:-10} $notebooks > "$OUT/notebooks.log" 2>&1 &
  nb=$!
  OMP_NUM_THREADS=2 timeout ${LIB_TIMEOUT:-300} python3 -m pytest tests -q -p no:cacheprovider -rfE -n ${LIB_WORKERS:-3} --continue-on-collection-errors \
    --ignore=tests/test_exercises.py --ignore=tests/test_grading.py > "$OUT/pytest_all.log" 2>&1
  echo "library suite rc=$? at ${SECONDS}s"; wait $nb
  cat "$OUT/notebooks.log"; grep -E "^(FAILED|ERROR)" "$OUT/pytest_all.log" | cut -c1-300; tail -3 "$OUT/pytest_all.log"
fi
