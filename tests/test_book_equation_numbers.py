"""book/_ext/equation_numbers.py numbers each chapter's equations (9.1), (9.2), ... (issue 42).

A three-page Sphinx project with the book's MyST maths settings is built in a temporary folder
(about 2 s): chapter 2's first equation must read (2.1), not (3), and references to it and to
chapter 1's second equation must read (2.1) and (1.2).
"""
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "book" / "_ext"))
import equation_numbers  # noqa: E402

PAGES = {
    "index.md": "# The book\n\n```{toctree}\nch1\nch2\nnotes\n```\n",
    "ch1.md": "# 1. One\n\n$$\na=1\n$$ (one-a)\n\n$$\nb=2\n$$ (one-b)\n",
    "ch2.md": "# 2. Two\n\n$$\nc=3\n$$ (two-c)\n\nSee {eq}`two-c` and {eq}`one-b`.\n",
    "notes.md": "# Notes\n\n$$\nd=4\n$$ (notes-d)\n",
}


def test_renumber_restarts_per_page_with_the_chapter_prefix():
    numbers = {"chapters/09_ssm": {"displaymath": {"equation-b": (98,), "equation-a": (97,)}},
               "book/notes": {"displaymath": {"equation-c": (99,)}, "figure": {"f": (1,)}}}
    titles = {"chapters/09_ssm": "9. State space models", "book/notes": "Notes"}
    assert equation_numbers.renumber(numbers, titles) == ["chapters/09_ssm", "book/notes"]
    assert numbers["chapters/09_ssm"]["displaymath"] == {"equation-a": (9, 1), "equation-b": (9, 2)}
    assert numbers["book/notes"] == {"displaymath": {"equation-c": (1,)}, "figure": {"f": (1,)}}
    assert equation_numbers.renumber(numbers, titles) == []  # a second pass changes nothing


def test_a_built_page_shows_and_references_chapter_numbers(tmp_path):
    sphinx_app = pytest.importorskip("sphinx.application")
    pytest.importorskip("myst_parser")
    src = tmp_path / "src"
    src.mkdir()
    for name, text in PAGES.items():
        (src / name).write_text(text, encoding="utf-8")
    (src / "conf.py").write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT / 'book' / '_ext')!r})\n"
        "extensions = ['myst_parser', 'equation_numbers']\n"
        "myst_enable_extensions = ['dollarmath', 'amsmath']\n"
        "numfig = True\nmath_numfig = True\nmath_number_all = False\n", encoding="utf-8")
    app = sphinx_app.Sphinx(str(src), str(src), str(tmp_path / "html"), str(tmp_path / "doctrees"),
                            "html", status=None, warning=None, freshenv=True)
    app.build()
    ch2 = (tmp_path / "html" / "ch2.html").read_text(encoding="utf-8")
    eqno = re.findall(r'class="eqno">\(([\d.]+)\)', ch2)
    assert eqno == ["2.1"], eqno
    refs = re.findall(r'<span class="std std-ref">|\((\d+\.\d+)\)</a>', ch2)
    assert ["2.1", "1.2"] == [r for r in refs if r], refs
    notes = (tmp_path / "html" / "notes.html").read_text(encoding="utf-8")
    assert re.findall(r'class="eqno">\(([\d.]+)\)', notes) == ["1"]
