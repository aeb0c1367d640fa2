#!/usr/bin/env bash
# Everything CI checks, in order; each step runs even if an earlier one failed, then one summary.
# Called by `make test` after it has set up .venv. Reports go to _build/test-reports/.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
REPORTS=_build/test-reports
mkdir -p "$REPORTS" && rm -f "$REPORTS"/*
: > "$REPORTS/steps.tsv"

step() {  # step NAME COMMAND... : run, record exit status and seconds
  local name=$1; shift
  echo
  echo "=== [$name] $*"
  local start=$SECONDS
  "$@"
  printf '%s\t%s\t%s\n' "$name" "$?" "$((SECONDS - start))" >> "$REPORTS/steps.tsv"
}

# The library tests run on every core (pytest-xdist; at most 4 workers), each worker and the grading
# runs it starts on one thread (OMP_NUM_THREADS=1): the tensors are small, and several processes
# each asking for every core's thread slowed torch's tests by up to 25x in a 2-core run.
step "library, exercises and hygiene tests" \
  env OMP_NUM_THREADS=1 $PY -m pytest tests -q -rfE -n auto --maxprocesses 4 \
  --junitxml="$REPORTS/library.xml"
# The chapters run twice: here without the saved results, as on Colab, and in the book build with
# them (-W: an error in any cell fails the build). The exercise solutions run here.
# The first run uses PyTorch's plain CPU kernels (ATEN_CPU_CAPABILITY=default: no SIMD), the book
# build this machine's own (AVX2 or AVX-512 here): PyTorch rounds differently under each, so a claim
# about a trained model that holds only under one machine's rounding fails one of the two runs.
step "exercise solutions (nbval)" \
  $PY -m pytest --nbval-lax --nbval-current-env -q -rfE --junitxml="$REPORTS/notebooks.xml" \
  exercises/*/ch*_exercises.ipynb
step "chapters without the saved results, as on Colab, on plain CPU kernels" \
  env ATEN_CPU_CAPABILITY=default bash scripts/run_as_colab.sh "$REPORTS/colab.xml"
step "book build (jupyter-book -W --keep-going)" \
  .venv/bin/jupyter-book build . --all -W --keep-going
step "built HTML in headless Chromium" \
  $PY scripts/check_html.py --junitxml "$REPORTS/html.xml"
$PY scripts/summary.py "$REPORTS"
