"""The book pages against the chapters and the library: the glossary defines the terms the first
chapters use, and `conventions.md` states ALiBi's slopes with the 0-based head index the chapters use."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from xfam_lib.positional import alibi_slopes

ROOT = Path(__file__).resolve().parent.parent
GLOSSARY = (ROOT / "book" / "glossary.md").read_text()
CONVENTIONS = (ROOT / "book" / "conventions.md").read_text()
ENTRIES = {line.split(" (")[0].lower() for line in GLOSSARY.splitlines() if line and line[0].isupper()}


def chapter_text(*numbers: int) -> str:
    text = []
    for n in numbers:
        path = next((ROOT / "chapters").glob(f"{n:02d}_*.ipynb"))
        text += ["".join(c["source"]) for c in json.loads(path.read_text())["cells"]]
    return " ".join(" ".join(text).split()).lower()      # whitespace as one space


@pytest.mark.parametrize("term, entry", [
    ("label smoothing", "label smoothing"), ("beam search", "beam search"),
    ("exposure bias", "exposure bias"), ("tie_weights", "weight tying"),
    ("arithmetic intensity", "arithmetic intensity"), ("pagedattention", "pagedattention"),
    ("swiglu", "swiglu"), ("flashattention", "flashattention"), ("nope", "nope, no positional encoding"),
])
def test_glossary_defines_the_terms_chapters_1_to_4_use(term, entry):
    assert term in chapter_text(1, 2, 3, 4), f"chapters 1-4 no longer use {term!r}"
    assert entry in ENTRIES, f"the glossary has no entry {entry!r}"


def test_glossary_value_is_a_soft_lookup():
    value = GLOSSARY[GLOSSARY.index("\nValue ("):].split("\n\n")[0]
    assert "selected;" not in value and "weighted average of all the values" in value


def test_conventions_state_alibi_slopes_with_0_based_heads():
    """The formulas as written in conventions.md, evaluated for 1..40 heads, equal `alibi_slopes`."""
    assert r"m_h = 2^{-8(h+1)/H}" in CONVENTIONS and r"$h = 0,\dots,H-1$" in CONVENTIONS
    assert r"2^{-4(2h+1)/P}" in CONVENTIONS and "no exception" in CONVENTIONS
    for heads in range(1, 41):
        p = 2 ** (heads.bit_length() - 1)
        stated = [2 ** (-8 * (h + 1) / p) for h in range(p)] + [2 ** (-4 * (2 * h + 1) / p) for h in range(heads - p)]
        assert alibi_slopes(heads, dtype=torch.float64).tolist() == pytest.approx(stated, rel=1e-15), heads


def test_bibliography_parses_and_holds_every_cited_key():
    """`book/references.bib` parses (a missing brace stops the whole book build) with no key twice,
    and every ``{cite}`` key of the chapters and the book pages has an entry."""
    import re

    from pybtex.database import parse_file

    entries = parse_file(str(ROOT / "book" / "references.bib")).entries       # raises on a syntax error
    pages = [p.read_text() for p in (ROOT / "book").glob("*.md")]
    pages += [json.dumps(json.loads(p.read_text())["cells"]) for p in (ROOT / "chapters").glob("*.ipynb")]
    cited = {key.strip() for text in pages for group in re.findall(r"\{cite[a-z:]*\}`([^`]+)`", text)
             for key in group.split(",")}
    assert cited and not cited - set(entries), sorted(cited - set(entries))


def test_bibliography_has_no_maths():
    """The bibliography page prints each field as text: ``$...$`` in a title is left on the page raw
    (the browser check found ``H$_2$O``), so names are written as plain text."""
    from pybtex.database import parse_file

    entries = parse_file(str(ROOT / "book" / "references.bib")).entries
    with_maths = [f"{key}: {field}" for key, entry in entries.items() for field, value in entry.fields.items()
                  if "$" in value]
    assert not with_maths, with_maths
