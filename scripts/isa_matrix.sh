#!/usr/bin/env bash
# Every chapter under each of PyTorch's CPU kernel sets (ATEN_CPU_CAPABILITY: default = no SIMD, avx2,
# avx512; a set the CPU lacks falls back to the best it has), alone (as on Colab) and with the saved
# results (as in the book build): a claim about a trained model that holds only under one machine's
# rounding fails here. Extra VAR=value arguments go to every run (OMP_NUM_THREADS=1, XFAM_SIZE_SCALE=4).
# Usage: scripts/isa_matrix.sh [VAR=value ...]   (from the repository root; `make isa-matrix`)
# About 6 minutes per configuration on 2 cores, six configurations.
set -u
PY=.venv/bin/python
bad=0; total=0
for cap in ${CAPS:-default avx2 avx512}; do
  for mode in alone saved; do
    total=$((total + 1)); log=$(mktemp -t "isa-$cap-$mode-XXXX.log")
    if [[ $mode == alone ]]; then
      env "$@" ATEN_CPU_CAPABILITY=$cap bash scripts/run_as_colab.sh "$log.xml" > "$log" 2>&1
    else
      env "$@" ATEN_CPU_CAPABILITY=$cap $PY -m pytest --nbval-lax --nbval-current-env -q -rfE \
        -p no:cacheprovider chapters > "$log" 2>&1
    fi
    rc=$?; [[ $rc -ne 0 ]] && bad=$((bad + 1))
    echo "$cap/$mode $*: rc=$rc, $(grep -E 'passed|failed' "$log" | tail -n 1 | sed 's/\x1b\[[0-9;]*m//g') (log $log)"
    grep -E '^FAILED' "$log" | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-160 | sed 's/^/   /'
  done
done
echo "isa matrix: $((total - bad)) of $total configurations pass"
[[ $bad -eq 0 ]]
