"""The canonical first cell of every chapter and exercise notebook, built from `_config.yml`.

The repository URL lives once, in `_config.yml`. `python scripts/setup_cell.py --fix` rewrites the
first cell of every notebook to the canonical one; tests/test_notebook_hygiene.py checks they match.
"""
from __future__ import annotations

import argparse
import json
import re
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TAG = "hide-cell"
CELL_ID = "xfam-setup"


def repository_value(key: str) -> str:
    """``repository: <key>:`` of `_config.yml` (read with a regex: no YAML dependency)."""
    text = (ROOT / "_config.yml").read_text(encoding="utf-8")
    block = re.search(r"^repository:\s*\n((?:[ \t]+.*\n?)+)", text, flags=re.M)
    match = block and re.search(rf"^\s+{key}:\s*(\S+)", block.group(1), flags=re.M)
    if not match:
        raise SystemExit(f"_config.yml has no repository: {key}:")
    return match.group(1)


def repository_url() -> str:
    """The `repository: url:` of `_config.yml`."""
    return repository_value("url")


def release() -> str:
    """The `repository: release:` of `_config.yml`: the tag the book is built from (``v`` + xfam_lib.__version__)."""
    return repository_value("release")


def colab_install_source(extra_pip: str = "", url: str = "", tag: str = "") -> str:
    """The Colab part of the setup cell: install ``xfam_lib`` at the release, or stop with one sentence.

    It asks the repository for the release tag first (``git ls-remote``), so no network, a wrong
    address and a missing release each get their own message; a failed ``pip install`` prints
    pip's error and stops the notebook instead of letting a later import fail. ``url`` and ``tag``
    default to `_config.yml`'s (tests pass others).
    """
    url, tag = url or repository_url(), tag or release()
    packages = ", ".join(["XFAM"] + ([extra_pip] if extra_pip else []))
    return COLAB_INSTALL.replace("{url}", url).replace("{tag}", tag).replace("{packages}", packages)


COLAB_INSTALL = """\
if "google.colab" in sys.modules:  # install xfam_lib at the release, or stop clearly
    import os, subprocess
    URL, RELEASE = "{url}", "{tag}"
    XFAM = f"xfam_lib @ git+{URL}@{RELEASE}"
    os.environ["GIT_TERMINAL_PROMPT"] = "0"  # a wrong address fails, no password prompt
    git = subprocess.run(["git", "ls-remote", "--tags", URL, RELEASE],
                         capture_output=True, text=True)
    if git.returncode:
        raise RuntimeError(f"Cannot reach {URL}: connect this runtime to the internet "
                           "(Runtime > Disconnect and delete runtime) and run again.")
    if not git.stdout.strip():
        raise RuntimeError(f"{URL} has no release {RELEASE}: open this notebook "
                           "from the book's Colab button, or ask which release to use.")
    packages = [{packages}]
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", *packages],
                         capture_output=True, text=True)
    if pip.returncode:
        print(pip.stderr[-3000:], file=sys.stderr)
        raise RuntimeError(f"Installing xfam_lib {RELEASE} failed (pip's message is "
                           "above): run this cell again; if it fails again, Runtime > "
                           "Disconnect and delete runtime, then Run all.")
"""


def setup_cell_source(extra_pip: str = "") -> str:
    """Source of the setup cell. ``extra_pip`` adds packages to the Colab install line (exercises: otter-grader).

    On Colab it installs ``xfam_lib`` at the release the book was built from, not whatever the
    default branch holds that day, and stops with a clear message when it cannot.
    """
    return (
        "# Setup (hidden in the book): on Colab, install the book's library;\n"
        "# everywhere, pick the device and seed.\n"
        "import sys\n"
        + colab_install_source(extra_pip) +
        "from xfam_lib.utils import pick_device, seed_everything, size_preset\n"
        "from xfam_lib.plots import use_style\n"
        "device = pick_device()\n"
        "SIZE = size_preset(device)  # the one size knob: x1 on a CPU, larger on a GPU\n"
        "seed_everything(0)\n"
        "use_style()\n"
        "print(f\"device: {device}, size preset: {SIZE.name} (x{SIZE.scale})\")"
    )


def notebooks() -> list[Path]:
    return sorted((ROOT / "chapters").glob("*.ipynb"))


def at_release(text: str) -> str:
    """``text`` with every Colab link into this repository opening the release instead of another ref."""
    colab = "https://colab.research.google.com/github/" + repository_url().split("github.com/", 1)[1]
    return re.sub(re.escape(colab) + r"/blob/[^/\s]+/", f"{colab}/blob/{release()}/", text)


COLAB_GPU = {"accelerator": "GPU", "colab": {"gpuType": "T4", "provenance": []}}  # "Open in Colab" starts on a GPU


def fix(path: Path) -> bool:
    """Make the first cell of ``path`` the canonical setup cell, open its Colab links at the release and
    ask Colab for a GPU runtime; True if changed."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    cell = {"cell_type": "code", "execution_count": None, "id": CELL_ID, "metadata": {"tags": [TAG]}, "outputs": [],
            "source": setup_cell_source().splitlines(keepends=True)}
    first = nb["cells"][0] if nb["cells"] else None
    missing_ids = [c for c in nb["cells"] if "id" not in c]
    gpu_ready = nb["metadata"].get("accelerator") == "GPU" and nb["metadata"].get("colab", {}).get("gpuType")
    stale_links = [c for c in nb["cells"] if c["cell_type"] == "markdown"
                   and at_release("".join(c["source"])) != "".join(c["source"])]
    for c in stale_links:
        c["source"] = at_release("".join(c["source"])).splitlines(keepends=True)
    if (not stale_links and first is not None and "".join(first["source"]) == setup_cell_source()
            and TAG in first["metadata"].get("tags", []) and first.get("id") == CELL_ID and not missing_ids
            and gpu_ready):
        return False
    if not gpu_ready:
        nb["metadata"]["accelerator"] = COLAB_GPU["accelerator"]
        nb["metadata"].setdefault("colab", {}).update(COLAB_GPU["colab"])
    for c in missing_ids:  # nbformat 4.5 requires an id on every cell
        c["id"] = uuid.uuid4().hex[:8]
    if first is not None and first["cell_type"] == "code" and "google.colab" in "".join(first["source"]):
        nb["cells"][0] = cell
    else:
        nb["cells"].insert(0, cell)
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return True


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fix", action="store_true", help="rewrite the setup cell of every chapter")
    args = parser.parse_args()
    if args.fix:
        for nb_path in notebooks():
            if fix(nb_path):
                print("updated", nb_path.relative_to(ROOT))
    else:
        print(setup_cell_source())
