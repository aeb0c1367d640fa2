#!/usr/bin/env bash
# Prepare a GPU check of the project. Run from the project root on the CPU machine:
#   bash scripts/gpu/prepare.sh
# It copies the check scripts into .gpu/ (ignored through .git/info/exclude) and downloads the
# Python 3.12 wheels a GPU machine without network lacks: the notebook stack, nbval, otter-grader
# with the parts of its dependencies a PyTorch image does not have (the exercise notebooks import
# it), and fla-core as a GPU oracle for the bench. Then, on the GPU machine, from the project root:
#   bash .gpu/check.sh            (the bench: bash .gpu/check.sh bench, needs ../shared/tools/gpu)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p .git/info .gpu/whl
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
cp "$here"/check.sh "$here"/run_notebooks.py .gpu/
[ -f ../shared/tools/gpu/gpu_bench.py ] && cp ../shared/tools/gpu/gpu_bench.py .gpu/
[ -n "$(ls .gpu/whl 2>/dev/null)" ] && { echo "wheels already in .gpu/whl"; exit 0; }
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d .gpu/whl \
  fla-core==0.6.0 asttokens==3.0.2 comm==0.2.3 debugpy==1.8.22 executing==2.3.0 fastjsonschema==2.22.3 \
  ipykernel==7.4.0 ipython==9.18.1 ipython_pygments_lexers==1.1.1 ipywidgets==8.1.9 jedi==0.20.1 \
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 jupyter_client==8.10.0 jupyter_core==5.9.1 \
  jupyterlab_widgets==3.0.17 matplotlib-inline==0.2.2 nbclient==0.11.0 nbformat==5.11.1 nbval==0.11.0 \
  parso==0.8.7 pexpect==4.9.0 platformdirs==4.14.7 prompt_toolkit==3.0.53 ptyprocess==0.7.0 pure_eval==0.2.4 \
  pyzmq==27.3.0 referencing==0.37.0 rpds-py==2026.9.1 stack-data==0.6.3 tornado==6.6.1 traitlets==5.16.1 \
  wcwidth==0.9.4 widgetsnbextension==4.0.16 \
  otter-grader==7.0.0 annotated-types==0.8.0 beautifulsoup4==4.15.0 bleach==6.4.0 defusedxml==0.7.1 \
  dill==0.4.1 docutils==0.22.4 fica==0.4.1 ipylab==1.1.0 jupyterlab_pygments==0.3.0 jupytext==1.19.6 \
  mdit_py_plugins==0.7.0 mistune==3.4.0 nbconvert==7.17.2 pandocfilters==1.5.1 pydantic==2.14.4 \
  pydantic-core==2.50.5 python-frontmatter==1.3.0 python-on-whales==0.81.0 soupsieve==4.1.3 \
  tinycss2==1.5.1 typing-inspection==0.4.5 webencodings==0.6.1 2>&1 | grep -v '^WARNING' || true
echo "wheels: $(ls .gpu/whl | wc -l) in .gpu/whl ($(du -sh .gpu/whl | cut -f1)); the working tree plus .gpu must stay under 64 MiB"
