#!/usr/bin/env bash
# Regenerate requirements-lock.txt, the constraints `make` installs with: one universal resolution
# (uv pip compile --universal) of requirements.txt and requirements-grading.txt for Python 3.11 and
# newer on every platform, with environment markers where a version differs (by Python version, by
# platform). torch is resolved as PyPI publishes it, so the lock also pins what its CUDA build needs on
# Linux (triton, the NVIDIA wheels); where the Makefile installs torch's CPU build first, those lines
# constrain nothing. requirements-nodeps.txt is exact already and stays out of the resolution.
# Usage: `make lock` keeps the locked versions and adds or drops only what a change of the
# requirements needs; `make lock UPGRADE=1` resolves every version afresh. uv, pinned here, is
# installed into a throwaway environment; PYTHON= chooses the interpreter that runs it.
# It records versions, not hashes (README, "Local installs").
set -euo pipefail
cd "$(dirname "$0")/.."
UV_VERSION=0.13.8
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --disable-pip-version-check "uv==$UV_VERSION"
cp requirements-lock.txt "$work/lock.txt"  # uv keeps the versions of the file it writes (its preferences)
upgrade=()
[ -n "${UPGRADE:-}" ] && upgrade=(--upgrade)
"$work/venv/bin/uv" pip compile -q --universal --python-version 3.11 --no-header --no-annotate \
  "${upgrade[@]}" requirements.txt requirements-grading.txt -o "$work/lock.txt"
{ echo "# Every version make installs, for Python 3.11-3.13 on Linux (with or without an NVIDIA driver),"
  echo "# macOS and Windows. Do not edit: 'make lock' regenerates it (scripts/lock.sh: uv $UV_VERSION,"
  echo "# pip compile --universal of requirements.txt and requirements-grading.txt)."
  grep -v '^#' "$work/lock.txt"; } > requirements-lock.txt
echo "wrote requirements-lock.txt ($(grep -vc '^#' requirements-lock.txt) pins)"
