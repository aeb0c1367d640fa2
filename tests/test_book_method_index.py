"""Every row of the method index (book/method_index.yml) points at things that exist.

The page book/method_index.md renders the file at build time (book/_ext/method_index.py), so the
page is as current as the file; this test keeps the file honest: each library name imports, each
test function is defined in its test file, each exercise part is a question of the chapter's
graded exercises, and each section label sits right above a heading of the row's chapter.
Cost: the imports of xfam_lib, about 3 s.
"""
import ast
import importlib
import json
import re
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "book" / "_ext"))
import method_index  # noqa: E402

ROWS = method_index.load_rows(ROOT / "book" / "method_index.yml")


@cache
def functions_in(path: str) -> set[str]:
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}


@cache
def exercise_parts(folder: str) -> set[str]:
    nb = json.loads((ROOT / "exercises" / folder / f"{folder}_exercises.ipynb").read_text(encoding="utf-8"))
    return {m.group(1) for cell in nb["cells"] if cell["cell_type"] == "raw"
            for m in re.finditer(r"^name:\s*(\S+)", "".join(cell["source"]), flags=re.M)}


@cache
def section_labels(chapter: str) -> set[str]:
    """The labels of a notebook that stand right above a heading."""
    labels = set()
    for cell in json.loads((ROOT / chapter).read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] == "markdown":
            labels |= set(re.findall(r"^\(([\w-]+)\)=\n#{1,6} ", "".join(cell["source"]), flags=re.M))
    return labels


def test_rows_are_unique_and_the_page_renders_the_file():
    ids = [row["id"] for row in ROWS]
    assert len(ids) == len(set(ids)), "a method appears twice"
    page = (ROOT / "book" / "method_index.md").read_text(encoding="utf-8")
    assert "```{method-index} method_index.yml" in page
    toc = (ROOT / "_toc.yml").read_text(encoding="utf-8")
    assert "file: book/method_index" in toc
    for chapter in {row["chapter"] for row in ROWS}:
        assert f"file: {chapter.removesuffix('.ipynb')}" in toc, f"{chapter} is not in _toc.yml"


def test_every_row_is_rendered_with_its_link():
    lines = method_index.markdown_lines(ROWS, "../")
    items = [line for line in lines if line.startswith("- {ref}`")]
    assert len(items) == len(ROWS)
    for row, item in zip(ROWS, items):
        assert f"<{row['section']}>`" in item and row["test"].removeprefix("tests/") in item


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row["id"])
def test_row_points_at_what_exists(row):
    for name in row["library"]:
        module, _, attr = name.rpartition(".")
        assert hasattr(importlib.import_module(module), attr), f"{name} does not exist"
    path, _, function = row["test"].partition("::")
    assert (ROOT / path).is_file(), f"no test file {path}"
    assert function in functions_in(path), f"{path} defines no {function}"
    if row["exercise"]:
        folder, _, part = row["exercise"].partition("/")
        assert part in exercise_parts(folder), f"exercises/{folder} has no question {part}"
    assert (ROOT / row["chapter"]).is_file(), f"no chapter {row['chapter']}"
    assert row["section"] in section_labels(row["chapter"]), (
        f"{row['chapter']} has no heading labelled ({row['section']})=: "
        "put the label line right above the section's heading")
