"""The appendix book/common_mistakes.md links to the sections that settle each mistake, and every
number it shows is pasted from a chapter's glued variables, never typed.

Checks: each {ref} target is a label right above a heading of some chapter; each cross-page
{glue:text}`../chapters/NN_x.ipynb::name:fmt` names a chapter that glues ``name``; outside maths,
roles and code the page holds no numeral; every chapter has its group of entries. Cost: < 1 s.
"""
import importlib.util
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "book" / "common_mistakes.md"
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))

spec = importlib.util.spec_from_file_location("hygiene", ROOT / "tests" / "test_notebook_hygiene.py")
hygiene = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hygiene)


def cells(path):
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def section_labels() -> set[str]:
    return {label for path in CHAPTERS for cell in cells(path) if cell["cell_type"] == "markdown"
            for label in re.findall(r"^\(([\w-]+)\)=\n#{1,6} ", "".join(cell["source"]), flags=re.M)}


def glued(path: Path) -> set[str]:
    return {name for cell in cells(path) if cell["cell_type"] == "code"
            for name in hygiene.glued_names("".join(cell["source"]))}


def test_every_link_reaches_a_section():
    page = PAGE.read_text(encoding="utf-8")
    refs = re.findall(r"\{ref\}`(?:[^`<]*<)?([\w-]+)>?`", page)
    assert len(refs) > 50, "the appendix should link every entry to its section"
    missing = sorted(set(refs) - section_labels())
    assert not missing, f"no chapter heading carries these labels: {missing}"


def test_every_number_is_pasted_from_a_chapter():
    page = PAGE.read_text(encoding="utf-8")
    pastes = re.findall(r"\{glue:text\}`\.\./(chapters/[\w.]+)::(\w+):[^`]+`", page)
    assert pastes and len(pastes) == page.count("{glue:text}`"), "glue from a chapter, with a format: path::name:fmt"
    for notebook, name in pastes:
        assert (ROOT / notebook).is_file(), f"no notebook {notebook}"
        assert name in glued(ROOT / notebook), f"{notebook} glues no {name!r}"
    prose = re.sub(r"\{[\w:-]+\}`[^`]*`", " ", page)
    prose = re.sub(r"`[^`]*`", " ", prose)
    prose = re.sub(r"\$[^$]*\$", " ", prose)
    typed = re.findall(r"(?<![\w.\-+])\d+(?:[.,]\d+)*(?!\w)", prose)
    assert not typed, f"numbers typed into the appendix (paste them with glue, or drop them): {typed}"


def test_every_chapter_has_its_entries():
    page = PAGE.read_text(encoding="utf-8")
    for path in CHAPTERS:
        assert f"{{doc}}`../chapters/{path.stem}`" in page, f"no entries from {path.name}"
