"""The text a reader sees never speaks of how the book is made.

Catalogue IDs (M1.4, E5.2, F3.1) belong in HTML comments or cell metadata, where the coverage
tooling reads them; phrases about the book's own making ("some retellings", "the source
documents", "time budget", "target met") do not belong anywhere a reader looks. Checked: the
Markdown of every chapter and book page outside comments, code spans and role targets (headings
and captions included), and the comments and string literals of every code cell (what the HTML
shows as code, or prints). Cost: well under a second.
"""
import io
import json
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb")) + sorted((ROOT / "book").glob("*.ipynb"))
PAGES = sorted((ROOT / "book").glob("*.md"))

CATALOGUE_ID = re.compile(r"\b[MEF]\d+\.\d+\b")
BOOK_MAKING = re.compile(
    r"ERRATA|errata\s+list|retelling|source\s+documents?|source\s+notes|survey\s+this\s+book|"
    r"this\s+book\s+started\s+from|time\s+budget|seed's\s+convention|not\s+in\s+the\s+seeds|"
    r"prose\s+below\s+states|method\s+catalogue|\bMISSED\b|\btarget\s+(?:met|missed)\b",
    re.I,
)


def visible_markdown(text: str) -> str:
    """Markdown without what the page does not show as prose: comments, code, role targets, labels."""
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    text = re.sub(r"^(`{3,}|~{3,}).*?^\1", " ", text, flags=re.S | re.M)
    text = re.sub(r"\{[\w:-]+\}`[^`]*`", " ", text)  # {cite}`key`, {glue:text}`name`, {ref}`label`
    text = re.sub(r"`[^`\n]*`", " ", text)
    return re.sub(r"^\([\w-]+\)=\s*$", " ", text, flags=re.M)


def code_text(source: str) -> str:
    """The comments and string literals of a code cell (magics dropped)."""
    code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
    tokens = tokenize.generate_tokens(io.StringIO(code + "\n").readline)
    return "\n".join(t.string for t in tokens if t.type in (tokenize.COMMENT, tokenize.STRING)
                     or t.type == getattr(tokenize, "FSTRING_MIDDLE", -1))


def problems(text: str, where: str) -> list[str]:
    found = [m.group(0) for m in CATALOGUE_ID.finditer(text)] + [m.group(0) for m in BOOK_MAKING.finditer(text)]
    return [f"{where}: {hit!r}" for hit in found]


def test_the_checks_see_what_they_should():
    """The filters keep prose and drop only what a reader does not see as prose."""
    md = "## 5.2 Recurrence (M5.1)\n<!-- M5.1 E5.1 -->\nAs some retellings say, `M3.1` {cite}`E2.1`."
    assert [p.split(": ")[1] for p in problems(visible_markdown(md), "x")] == ["'M5.1'", "'retelling'"]
    code = 'x = 1  # target met (E4.3)\nprint("F2.6: weights")\ny = M1 * 2.5\n'
    assert [p.split(": ")[1] for p in problems(code_text(code), "x")] == ["'E4.3'", "'F2.6'", "'target met'"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_notebook_text_has_no_catalogue_ids_or_book_making(path):
    found = []
    for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            found += problems(visible_markdown(source), f"cell {i}")
        elif cell["cell_type"] == "code":
            found += problems(code_text(source), f"cell {i} (code)")
    assert not found, ("catalogue IDs or book-making words where a reader sees them (move IDs into an "
                       "HTML comment or the cell's metadata 'catalogue_ids'): " + "; ".join(found[:10]))


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_book_page_has_no_catalogue_ids_or_book_making(path):
    found = problems(visible_markdown(path.read_text(encoding="utf-8")), path.name)
    assert not found, "catalogue IDs or book-making words on a book page: " + "; ".join(found[:10])


LIBRARY = sorted((ROOT / "xfam_lib").rglob("*.py"))


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: str(p.relative_to(ROOT)))
def test_library_docstrings_and_comments_have_no_catalogue_ids_or_book_making(path):
    """Chapters display the library's own source (`show_source`) and readers call `help()` on it, so its
    docstrings and comments are reader text too."""
    found = problems(code_text(path.read_text(encoding="utf-8")), path.name)
    assert not found, "catalogue IDs or book-making words in the library's text: " + "; ".join(found[:10])
