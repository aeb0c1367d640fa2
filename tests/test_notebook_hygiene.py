"""Every chapter notebook is stored clean and starts the same way (DESIGN.md "Chapter anatomy").

Stored without outputs; the canonical setup cell first (tagged hidden, from scripts/setup_cell.py),
and every code cell before the first section folded as it is;
code lines within the HTML column; a Python 3 kernelspec; Colab's GPU-runtime metadata (so "Open in Colab" starts on a GPU); imports xfam_lib; a numbered title; cites its METHODS rows; listed in _toc.yml.
Exercise master notebooks are also stored without outputs.
"""
import ast
import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
EXERCISES = sorted((ROOT / "exercises").glob("*/*.ipynb")) + sorted((ROOT / "exercises").glob("*/student/*.ipynb"))

spec = importlib.util.spec_from_file_location("setup_cell", ROOT / "scripts" / "setup_cell.py")
setup_cell = importlib.util.module_from_spec(spec)
spec.loader.exec_module(setup_cell)


def load(path):
    return json.loads(path.read_text(encoding="utf-8"))


def source(cell):
    return "".join(cell["source"])


def test_there_are_chapters():
    assert CHAPTERS, "no chapters/*.ipynb found"


@pytest.mark.parametrize("path", CHAPTERS + EXERCISES, ids=lambda p: str(p.relative_to(ROOT)))
def test_stored_without_outputs(path):
    for i, cell in enumerate(load(path)["cells"]):
        if cell["cell_type"] == "code":
            assert not cell.get("outputs"), f"cell {i} has outputs: strip them"
            assert cell.get("execution_count") is None, f"cell {i} has an execution count"


CODE_COLUMN = 88     # characters of code the book's HTML column shows without cutting or scrolling


@pytest.mark.parametrize("path", CHAPTERS + [ROOT / "book" / "benchmarks.ipynb"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_code_fits_the_html_column(path):
    """Every code line of a page of the book fits the column (`ruff format` with the project's
    line length gets most of the way; long strings and comments are split by hand)."""
    wide = [f"cell {i} line {k + 1} ({len(line)} chars)"
            for i, cell in enumerate(load(path)["cells"]) if cell["cell_type"] == "code"
            for k, line in enumerate(source(cell).splitlines()) if len(line) > CODE_COLUMN]
    assert not wide, f"{len(wide)} code lines wider than {CODE_COLUMN} columns: " + "; ".join(wide[:5])


def glued_names(code: str) -> list[str]:
    """The keyword names of every ``glue(...)`` call in a cell's code."""
    tree = ast.parse("\n".join(line for line in code.splitlines() if not line.lstrip().startswith(("%", "!"))))
    return [kw.arg for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "glue"
            for kw in node.keywords if kw.arg]


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_each_glue_name_is_glued_by_one_cell(path):
    """Two cells gluing one name make the book build warn (myst-nb: "glue key ... duplicate"),
    which -W turns into a failure after every chapter has run; this finds it in a second."""
    cells_of = {}
    for i, cell in enumerate(load(path)["cells"]):
        if cell["cell_type"] == "code":
            for name in set(glued_names(source(cell))):
                cells_of.setdefault(name, []).append(i)
    twice = {name: cells for name, cells in cells_of.items() if len(cells) > 1}
    assert not twice, f"glued by more than one cell: {twice}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_figures_fit_the_html_column(path):
    """Every ``figsize=(w, h)`` a chapter writes is at most `plots.MAX_WIDTH` inches wide: wider
    figures are shrunk in the book's column until their text is too small (scripts/check_html.py
    measures the built pages)."""
    import xfam_lib.plots as plots

    wide = [f"cell {i}: {m.group(0)}" for i, cell in enumerate(load(path)["cells"]) if cell["cell_type"] == "code"
            for m in re.finditer(r"figsize=\(\s*([\d.]+)", source(cell)) if float(m.group(1)) > plots.MAX_WIDTH]
    assert not wide, "figures wider than the column allows: " + "; ".join(wide)


@pytest.mark.parametrize("path", CHAPTERS + EXERCISES, ids=lambda p: str(p.relative_to(ROOT)))
def test_opens_on_a_colab_gpu_runtime(path):
    meta = load(path)["metadata"]
    assert meta.get("accelerator") == "GPU" and meta.get("colab", {}).get("gpuType"), \
        "notebook metadata needs Colab's GPU runtime: \"accelerator\": \"GPU\", \"colab\": {\"gpuType\": \"T4\"}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_chapter_anatomy(path):
    nb = load(path)
    assert re.fullmatch(r"\d\d_[a-z0-9_]+\.ipynb", path.name), "chapters are named NN_slug.ipynb"
    assert nb["metadata"].get("kernelspec", {}).get("name") == "python3"
    assert nb["metadata"]["kernelspec"].get("language") == "python"
    first = nb["cells"][0]
    assert first["cell_type"] == "code" and source(first) == setup_cell.setup_cell_source(), \
        "cell 0 must be the canonical setup cell: run `python scripts/setup_cell.py --fix`"
    assert setup_cell.TAG in first["metadata"].get("tags", []), f"setup cell must be tagged {setup_cell.TAG}"
    code = "\n".join(source(c) for c in nb["cells"] if c["cell_type"] == "code")
    assert re.search(r"^\s*(from|import) xfam_lib", code, flags=re.M), "a chapter must import xfam_lib"
    markdown = [source(c) for c in nb["cells"] if c["cell_type"] == "markdown"]
    number = int(path.name[:2])
    assert markdown and re.match(rf"#\s+{number}\.\s+\S", markdown[0]), "first markdown cell: '# N. Title'"
    assert re.search(rf"\bM{number}\.\d+\b", "\n".join(markdown)), "cite the chapter's METHODS rows (M{N}.{row})"
    assert "{cite}" in "\n".join(markdown), "cite papers with {cite}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_opening_code_is_folded(path):
    """The code before a chapter's first section (the setup cell, the imports cell) is folded away
    in the HTML, as the setup cell is, so the reader meets the idea first."""
    cells = load(path)["cells"]
    first_section = next((i for i, c in enumerate(cells) if c["cell_type"] == "markdown"
                          and re.search(r"^##\s", source(c), flags=re.M)), len(cells))
    unfolded = [i for i, c in enumerate(cells[:first_section]) if c["cell_type"] == "code"
                and setup_cell.TAG not in c["metadata"].get("tags", [])]
    assert not unfolded, f"code cells {unfolded} come before the first section: tag them {setup_cell.TAG!r}"


def test_every_chapter_is_in_the_toc():
    toc = (ROOT / "_toc.yml").read_text(encoding="utf-8")
    for path in CHAPTERS:
        assert f"file: chapters/{path.stem}" in toc, f"{path.name} is missing from _toc.yml"


def test_setup_cell_uses_the_one_repository_url():
    url = setup_cell.repository_url()
    assert url.startswith("https://github.com/")
    source = setup_cell.setup_cell_source()
    assert f'URL, RELEASE = "{url}", "{setup_cell.release()}"' in source
    assert 'XFAM = f"xfam_lib @ git+{URL}@{RELEASE}"' in source
