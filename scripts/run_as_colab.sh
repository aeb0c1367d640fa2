#!/usr/bin/env bash
# Execute every chapter the way Colab does: the notebooks alone, without the repository's saved results
# (benchmarks/results, experiments/results) beside them, so every cell that reads a saved file must take
# its "not here" branch. The library is this checkout's (Colab installs the released tag).
# Usage: scripts/run_as_colab.sh JUNIT_XML   (from the repository root).
set -euo pipefail
root=$PWD
junit=$(realpath -m "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/chapters"
cp chapters/*.ipynb "$work/chapters/"
cd "$work"
"$root/.venv/bin/python" -m pytest --nbval-lax --nbval-current-env -q -rfE -p no:cacheprovider \
  --junitxml="$junit" chapters
