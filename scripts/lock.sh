#!/usr/bin/env bash
# Regenerate requirements-lock.txt, the constraints `make` installs with: resolve requirements.txt and
# requirements-grading.txt (torch's CPU build, as the Makefile installs it where there is no GPU) and
# requirements-nodeps.txt in a throwaway Python 3.11 environment, then record every installed version
# (names normalised, sorted). Usage: `make lock` keeps the locked versions and adds or drops only what a
# change of the requirements needs; `make lock UPGRADE=1` resolves every version afresh.
# PYTHON=python3.11 chooses the interpreter. pip freeze records versions, not hashes (README, "Local installs").
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m venv "$work/venv"
pip=("$work/venv/bin/python" -m pip install -q --disable-pip-version-check)
torch_pin=$(grep -E '^torch==' requirements.txt | cut -d' ' -f1)
if [ "$(uname -s)" = Linux ]; then
  "${pip[@]}" --no-deps --retries 1 --extra-index-url https://download.pytorch.org/whl/cpu "$torch_pin+cpu"
fi
keep=(-c requirements-lock.txt)
[ -n "${UPGRADE:-}" ] && keep=()
"${pip[@]}" -r requirements.txt -r requirements-grading.txt "${keep[@]}"
"${pip[@]}" --no-deps -r requirements-nodeps.txt
"$work/venv/bin/python" -m pip freeze --exclude-editable --disable-pip-version-check \
  | sed -E 's/\+cpu$//' \
  | awk -F'==' '{ name = tolower($1); gsub(/[_.]/, "-", name); print name "==" $2 }' \
  | LC_ALL=C sort -t= -k1,1 > "$work/lock.txt"
mv "$work/lock.txt" requirements-lock.txt
echo "wrote requirements-lock.txt ($(wc -l < requirements-lock.txt) pins)"
