"""Every chapter and student exercise notebook alone, as on Colab, in a twin of Colab's runtime.

The twin is a venv of Colab's Python with Colab's versions (requirements-colab.txt, Colab's own
listing) of what the book needs there: xfam_lib's dependencies (pyproject.toml), Triton, IPython
and the kernel, and nbclient, which runs the notebooks; pip resolves them with the whole listing as
constraints, so every dependency pulled in is at Colab's version too. torch is PyPI's build of
Colab's release (Colab's carries a CUDA tag, +cu128); everything runs on the CPU.

Each notebook runs alone in an empty folder, in a kernel that believes it is on Colab (a startup
file puts a ``google.colab`` module in ``sys.modules``), so its setup cell takes Colab's branch: it
installs xfam_lib (and what an exercise notebook adds) with pip from the repository at the release,
and an exercise notebook fetches its public tests. The repository is a scratch clone of this
checkout (HEAD with the uncommitted changes of tracked files), tagged with the release of
_config.yml, that git reads in place of the repository's address. After each notebook the venv is
compared with the twin as built: a Colab package whose version changed or that was removed fails
that notebook; the venv is then put back as built, so the next notebook starts as on a fresh runtime.

Usage: python3 scripts/colab_twin.py [NOTEBOOK...]   (`make colab-twin`; default: every chapter and
student notebook). TWIN_PYTHON names Colab's Python (default python3.<minor> from the listing);
the venv is kept in _build/colab-twin/venv (about 5 GB) and rebuilt when requirements-colab.txt
changes. Results: _build/colab-twin/results.json and one log per notebook.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "scripts"), str(ROOT / "scripts" / "gpu")]
import setup_cell  # noqa: E402  (the release and the repository's address)
from run_notebooks import RUNNER  # noqa: E402  (executes one notebook with nbclient)

LISTING = ROOT / "requirements-colab.txt"
WORK = ROOT / "_build" / "colab-twin"
VENV = WORK / "venv"
PY = VENV / "bin" / "python"
# what the notebooks import beyond xfam_lib's dependencies, the kernel, the notebook runner, and
# the pip that the setup cells run
EXTRA_ROOTS = ["triton", "ipython", "ipykernel", "nbformat", "packaging", "nbclient", "pip"]
# installed by the setup cells themselves: expected additions, removed again after each notebook
OURS = {"xfam-lib", "xfam-grading"}
CUDA_RUNTIME = ("nvidia-", "cuda-")   # name prefixes of the CUDA runtime's wheels
NOTEBOOK_TIMEOUT_S = 900
COLAB_STARTUP = "import sys, types\nsys.modules['google.colab'] = types.ModuleType('google.colab')\n"


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def colab_versions() -> dict[str, str]:
    """Colab's ``name==version`` lines (normalized names); direct-URL lines are left out."""
    versions = {}
    for line in LISTING.read_text(encoding="utf-8").splitlines():
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line.strip())
        if match:
            versions[normalize(match.group(1))] = match.group(2)
    return versions


def colab_python() -> str:
    match = re.search(r"^# Python: (3\.\d+)", LISTING.read_text(encoding="utf-8"), flags=re.M)
    if not match:
        raise SystemExit(f"{LISTING.name} has no '# Python: 3.N' line")
    return match.group(1)


def installed() -> dict[str, str]:
    """Every distribution in the twin, normalized name -> version."""
    code = ("import importlib.metadata as m, json\n"
            "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))")
    out = subprocess.run([str(PY), "-c", code], capture_output=True, text=True, check=True).stdout
    return {normalize(name): version for name, version in json.loads(out).items()}


def pip(*args: str) -> None:
    subprocess.run([str(PY), "-m", "pip", "-q", "--disable-pip-version-check", *args], check=True)


def build(colab: dict[str, str]) -> dict[str, str]:
    """The twin venv (kept while the listing and the recipe are unchanged: rebuilt afresh for
    another listing, completed in place for another recipe); returns what it holds."""
    stamp = WORK / "listing.sha256"
    recipe = "\n".join([*EXTRA_ROOTS, CHECK_ROOTS, (ROOT / "requirements-grading.txt").read_text()])
    digest = " ".join(hashlib.sha256(x).hexdigest() for x in (LISTING.read_bytes(), recipe.encode()))
    if PY.exists() and stamp.exists() and stamp.read_text() == digest:
        return json.loads((WORK / "twin.json").read_text())
    python = os.environ.get("TWIN_PYTHON", f"python{colab_python()}")
    found = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                           capture_output=True, text=True)
    if found.returncode or found.stdout.strip() != colab_python():
        raise SystemExit(f"the twin needs Colab's Python {colab_python()}; '{python}' is "
                         f"{found.stdout.strip() or 'not runnable'}: set TWIN_PYTHON=/path/to/python"
                         f"{colab_python()}")
    if stamp.exists() and stamp.read_text().split()[0] != digest.split()[0]:
        shutil.rmtree(VENV, ignore_errors=True)  # built from another listing: start afresh
        stamp.unlink()
    WORK.mkdir(parents=True, exist_ok=True)
    if not PY.exists():  # (an unfinished build is completed by the install below)
        subprocess.run([python, "-m", "venv", str(VENV)], check=True)
    # Colab's versions as constraints; a local version tag (torch's +cu128) names an index PyPI is not.
    # Colab's torch is PyTorch's CUDA 12.8 build, PyPI's a CUDA 13 one that pins its own NVIDIA wheels:
    # Colab's CUDA runtime wheels (idle on the CPU) are left out of the constraints.
    constraints = WORK / "constraints.txt"
    constraints.write_text("".join(f"{n}=={v.split('+')[0]}\n" for n, v in colab.items()
                                   if not n.startswith(CUDA_RUNTIME)))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    roots = [re.split(r"[<>=!~; \[]", d)[0] for d in project["dependencies"]] + EXTRA_ROOTS
    start = time.time()
    print(f"building the twin in {VENV}: {', '.join(roots)} at Colab's versions", flush=True)
    pip("install", *roots, "-c", str(constraints))
    # the exercise notebooks' setup cells install their checks without dependencies: what those
    # take from Colab must be in the twin too, at Colab's versions
    taken = check_roots(colab)
    print(f"what the exercise checks take from Colab: {', '.join(taken)}", flush=True)
    pip("install", *taken, "-c", str(constraints))
    twin = installed()
    print(f"twin built in {time.time() - start:.0f} s: {len(twin)} distributions", flush=True)
    off = {n: v for n, v in twin.items() if n in colab and colab[n].split("+")[0] != v
           and not n.startswith(CUDA_RUNTIME)}
    if off:
        raise SystemExit(f"the twin's versions differ from Colab's: {off}")
    absent = sorted(n for n in twin if n not in colab)
    print(f"in the twin, not in Colab's listing: {', '.join(absent) or 'none'}", flush=True)
    (WORK / "twin.json").write_text(json.dumps(twin, indent=1))
    stamp.write_text(digest)
    return twin


CHECK_ROOTS = """
import json, sys, tempfile, zipfile, pathlib, subprocess
from email.parser import Parser
from packaging.requirements import Requirement
sys.path.insert(0, sys.argv[1])
import build  # exercises/build.py: the pins the setup cells install with --no-deps
with tempfile.TemporaryDirectory() as tmp:
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp,
                    *build.check_requirements()], check=True)
    names = set()
    for wheel in pathlib.Path(tmp).glob("*.whl"):
        with zipfile.ZipFile(wheel) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            for line in Parser().parsestr(z.read(meta).decode()).get_all("Requires-Dist") or []:
                req = Requirement(line)
                if req.marker is None or req.marker.evaluate({"extra": ""}):
                    names.add(req.name)
print(json.dumps(sorted(names)))
"""


def check_roots(colab: dict[str, str]) -> list[str]:
    """The requirements of the packages the exercise setup cells install without their
    dependencies (``exercises/build.py``'s ``check_requirements``) that Colab's listing has:
    on Colab they are there already, so the twin must hold them (at Colab's versions)."""
    out = subprocess.run([str(PY), "-c", CHECK_ROOTS, str(ROOT / "exercises")],
                         capture_output=True, text=True, check=True).stdout
    return [n for n in json.loads(out) if normalize(n) in colab]


def scratch_repository(work: Path) -> tuple[str, Path]:
    """A clone of this checkout (HEAD + uncommitted changes of tracked files) with the release tag."""
    release = setup_cell.release()
    commit = subprocess.run(["git", "stash", "create"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.strip() or "HEAD"
    repo = work / "repository.git"
    subprocess.run(["git", "init", "-q", "--bare", "--initial-branch=main", str(repo)], check=True)
    subprocess.run(["git", "push", "-q", str(repo), f"{commit}:refs/heads/main"], cwd=ROOT, check=True)
    subprocess.run(["git", "-C", str(repo), "tag", "-f", release, "main"], check=True,
                   capture_output=True)
    subprocess.run(["git", "-C", str(repo), "config", "uploadpack.allowFilter", "true"], check=True)
    return release, repo


def colab_environment(work: Path, repo: Path) -> dict[str, str]:
    """The environment of a kernel that believes it is on Colab and reaches ``repo`` for the repository."""
    startup = work / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-colab.py").write_text(COLAB_STARTUP)
    gitconfig = work / "gitconfig"
    subprocess.run(["git", "config", "--file", str(gitconfig), f"url.{repo.as_uri()}.insteadOf",
                    setup_cell.repository_url()], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XFAM_", "PYTHON", "VIRTUAL_ENV"))}
    return {**env, "IPYTHONDIR": str(work / "ipython"), "GIT_CONFIG_GLOBAL": str(gitconfig),
            "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "2")}


def changes(twin: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """What a notebook changed: (Colab packages changed or removed, packages added)."""
    now = installed()
    changed = [f"{n} {v} -> {now.get(n, 'removed')}" for n, v in twin.items() if now.get(n) != v]
    added = {n: v for n, v in now.items() if n not in twin}
    return changed, added


def restore(twin: dict[str, str], added: dict[str, str]) -> None:
    """Put the venv back as built: remove what was added, reinstall what was changed (no dependencies)."""
    if added:
        pip("uninstall", "-y", *added)
    now = installed()
    back = [f"{n}=={v}" for n, v in twin.items() if now.get(n) != v]
    if back:
        pip("install", "--no-deps", *back)


def run(notebook: Path, work: Path, env: dict[str, str], colab: dict[str, str],
        twin: dict[str, str]) -> dict:
    folder = work / notebook.stem / notebook.parent.name
    folder.mkdir(parents=True)
    target = folder / notebook.name
    shutil.copy(notebook, target)
    start = time.time()
    try:
        p = subprocess.run([str(PY), "-c", RUNNER, str(target), str(NOTEBOOK_TIMEOUT_S)], env=env,
                           cwd=folder, capture_output=True, text=True, timeout=NOTEBOOK_TIMEOUT_S)
        status, tail = ("ok" if p.returncode == 0 else "fail"), (p.stdout + p.stderr)[-2500:]
    except subprocess.TimeoutExpired:
        status, tail = "timeout", ""
    seconds = round(time.time() - start, 1)
    changed, added = changes(twin)
    foreign = {n: v for n, v in added.items() if n not in OURS}
    if changed and status == "ok":
        status = "changed"
    restore(twin, added)
    notes = [f"changed {', '.join(changed)}"] if changed else []
    if foreign:
        notes.append("added " + ", ".join(f"{n} {v}" + (f" (Colab has {colab[n]})" if n in colab else "")
                                          for n, v in sorted(foreign.items())))
    if status != "ok":
        notes.append(next((line for line in reversed(tail.splitlines()) if "Error" in line), "")[:300])
    rel = notebook.relative_to(ROOT).as_posix()
    print(f"{status:8} {seconds:6.1f}s {rel}" + "".join(f"\n           {n}" for n in notes if n), flush=True)
    (WORK / "logs").mkdir(exist_ok=True)
    (WORK / "logs" / (rel.replace("/", "_") + ".log")).write_text(tail)
    return {"notebook": rel, "status": status, "seconds": seconds, "changed": changed,
            "added": foreign, "tail": tail if status != "ok" else ""}


def main() -> int:
    colab = colab_versions()
    twin = build(colab)
    restore(twin, changes(twin)[1])  # as built, should an interrupted run have left it otherwise
    notebooks = [Path(a).resolve() for a in sys.argv[1:]] or (
        sorted((ROOT / "chapters").glob("*.ipynb")) + sorted(ROOT.glob("exercises/ch*/student/ch*.ipynb")))
    versions = subprocess.run([str(PY), "-c", "import sys, torch, triton, numpy, ipywidgets; print("
                               "sys.version.split()[0], torch.__version__, triton.__version__, "
                               "numpy.__version__, ipywidgets.__version__)"],
                              capture_output=True, text=True, check=True).stdout.split()
    print("twin: python {}, torch {}, triton {}, numpy {}, ipywidgets {}".format(*versions), flush=True)
    with tempfile.TemporaryDirectory(prefix="colab-twin-") as tmp:
        work = Path(tmp)
        release, repo = scratch_repository(work)
        print(f"setup cells install from a clone of this checkout tagged {release}", flush=True)
        env = colab_environment(work, repo)
        results = [run(nb, work, env, colab, twin) for nb in notebooks]
    (WORK / "results.json").write_text(json.dumps(results, indent=1))
    bad = [r["notebook"] for r in results if r["status"] != "ok"]
    print(f"colab twin: {len(results) - len(bad)} of {len(results)} notebooks ok"
          + (f"; not ok: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
