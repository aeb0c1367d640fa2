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


def setup_cell_source(extra_pip: str = "") -> str:
    """Source of the setup cell. ``extra_pip`` adds packages to the Colab install line (exercises: otter-grader).

    On Colab it installs ``xfam_lib`` at the release the book was built from, not whatever the
    default branch holds that day.
    """
    install = f'"xfam_lib @ git+{repository_url()}@{release()}"' + (f" {extra_pip}" if extra_pip else "")
    return (
        "# Setup (hidden in the book): on Colab, install the book's library; everywhere, pick the device and seed.\n"
        "import sys\n"
        "if \"google.colab\" in sys.modules:\n"
        f"    %pip install -q {install}\n"
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


COLAB_GPU = {"accelerator": "GPU", "colab": {"gpuType": "T4", "provenance": []}}  # "Open in Colab" starts on a GPU


def fix(path: Path) -> bool:
    """Make the first cell of ``path`` the canonical setup cell and ask Colab for a GPU runtime; True if changed."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    cell = {"cell_type": "code", "execution_count": None, "id": CELL_ID, "metadata": {"tags": [TAG]}, "outputs": [],
            "source": setup_cell_source().splitlines(keepends=True)}
    first = nb["cells"][0] if nb["cells"] else None
    missing_ids = [c for c in nb["cells"] if "id" not in c]
    gpu_ready = nb["metadata"].get("accelerator") == "GPU" and nb["metadata"].get("colab", {}).get("gpuType")
    if (first is not None and "".join(first["source"]) == setup_cell_source()
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
