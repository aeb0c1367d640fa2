"""Number each chapter's equations on their own, (9.1), (9.2), ..., as its figures are numbered.

Sphinx numbers displayed equations (``math_numfig``) with one counter for the whole book, so
chapter 9 would open at (97). After Sphinx has assigned those numbers (the ``env-get-updated``
event), this extension renumbers every page's equations from 1 in reading order, prefixed with
the chapter's number when the page's title starts with one ("9. State space models"). Equation
references ({eq}`label`) read the same table, so they follow.
"""
from __future__ import annotations

import re

CHAPTER_TITLE = re.compile(r"(\d+)\.\s")


def chapter_number(title: str) -> int | None:
    """The N of a title "N. Name", or None for a page that is not a chapter."""
    match = CHAPTER_TITLE.match(title)
    return int(match.group(1)) if match else None


def renumber(fignumbers: dict[str, dict[str, dict[str, tuple[int, ...]]]],
             titles: dict[str, str]) -> list[str]:
    """Renumber ``fignumbers[doc]["displaymath"]`` in place, per document: (N, 1), (N, 2), ... in
    chapter N, (1,), (2,), ... elsewhere, keeping the order Sphinx gave. Returns the documents changed."""
    changed = []
    for docname, kinds in fignumbers.items():
        numbers = kinds.get("displaymath")
        if not numbers:
            continue
        chapter = chapter_number(titles.get(docname, ""))
        prefix = () if chapter is None else (chapter,)
        in_order = sorted(numbers, key=numbers.__getitem__)
        new = {equation: (*prefix, k) for k, equation in enumerate(in_order, start=1)}
        if new != numbers:
            kinds["displaymath"] = new
            changed.append(docname)
    return changed


def number_per_chapter(app, env) -> list[str]:
    titles = {docname: title.astext() for docname, title in env.titles.items()}
    return renumber(env.toc_fignumbers, titles)


def setup(app):
    app.connect("env-get-updated", number_per_chapter, priority=900)  # after Sphinx's own (500)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
