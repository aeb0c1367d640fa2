#!/usr/bin/env bash
# The kernel tests (tests/test_kernels*.py, in Triton's CPU interpreter) under each Triton a reader
# meets besides the pinned one, which `make test` runs: Colab's, with Colab's NumPy (Triton 3.6's
# interpreter fails on NumPy 2.4, the pinned one: range() over a 1-element array), both read from
# requirements-colab.txt, and the newest (NEWEST_TRITON). Each set is installed alone into
# _build/tritons/NAME (pip --no-deps --target, about 1 GB each, kept for the next run) and put first
# on the path of .venv's Python, whose torch stays the pinned one.
# Usage (from the repository root, after make): bash scripts/test_tritons.sh [SET...], a SET being a
# Triton version or comma-separated pins (`make test-tritons TRITONS="3.6.0 triton==3.8.0,numpy==2.1.3"`).
# Reports: _build/test-reports/triton-NAME.xml and .log.
set -uo pipefail
cd "$(dirname "$0")/.."
NEWEST_TRITON=3.9.0   # the newest release on PyPI on 2026-12-01
colab() { sed -nE "s/^$1==([^ ;#]+).*/\\1/p" requirements-colab.txt; }
sets=("$@")
[ ${#sets[@]} -eq 0 ] && sets=("triton==$(colab triton),numpy==$(colab numpy)" "$NEWEST_TRITON")
py=.venv/bin/python
pinned=$($py -c 'import triton; print(triton.__version__)')
mkdir -p _build/test-reports
summary=()
failed=0
for set in "${sets[@]}"; do
  [[ $set == *==* ]] || set="triton==$set"
  IFS=, read -r -a pins <<< "$set"
  name=$(IFS=-; echo "${pins[*]//==/}")                 # triton3.6.0-numpy2.1.3
  site=_build/tritons/$name
  if [ ! -f "$site/.installed" ]; then
    rm -rf "$site"
    $py -m pip install -q --disable-pip-version-check --no-deps --target "$site" "${pins[@]}" \
      || { summary+=("$set: not installed (pip's message is above)"); failed=1; continue; }
    touch "$site/.installed"
  fi
  found=$(PYTHONPATH=$site $py -c 'import triton, numpy; print(f"triton=={triton.__version__}", f"numpy=={numpy.__version__}")')
  for pin in "${pins[@]}"; do
    [[ " $found " == *" $pin "* ]] || { summary+=("$set: $site gives $found"); failed=1; continue 2; }
  done
  echo
  echo "=== tests/test_kernels*.py with $found (the pinned triton is $pinned)"
  start=$SECONDS
  PYTHONPATH=$site OMP_NUM_THREADS=1 $py -m pytest tests/test_kernels.py tests/test_kernels_scan.py \
    -q -rfE -n auto --maxprocesses 4 --junitxml="_build/test-reports/triton-$name.xml" \
    > "_build/test-reports/triton-$name.log" 2>&1
  rc=$?
  grep -E '^(FAILED|ERROR)' "_build/test-reports/triton-$name.log" | cut -c1-300
  summary+=("$found: $(tail -n 1 "_build/test-reports/triton-$name.log" | tr -d '=') ($((SECONDS - start)) s)")
  [ $rc -eq 0 ] || failed=1
done
echo
printf '%s\n' "${summary[@]}"
exit $failed
