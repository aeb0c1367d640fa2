"""The method index, rendered at build time from one source, ``book/method_index.yml``.

A page writes ``{method-index} method_index.yml`` (the path is relative to the page); the directive
reads the rows (method, chapter, section label, library names, test, exercise part) and renders,
chapter by chapter, one line per method: its name linked to the section that teaches it, the
``xfam_lib`` names, the test and the graded exercise part. Nothing is generated into the
repository, so the page cannot fall behind the table; tests/test_book_method_index.py checks that
every row points at things that exist.
"""
from __future__ import annotations

from pathlib import Path

import yaml
from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective

FIELDS = ("id", "method", "chapter", "section", "library", "test", "exercise")


def load_rows(path: Path) -> list[dict]:
    """The rows of a method-index file, each with every field (``exercise`` may be empty)."""
    rows = yaml.safe_load(path.read_text(encoding="utf-8"))["methods"]
    for row in rows:
        missing = [f for f in FIELDS if f not in row]
        if missing:
            raise ValueError(f"{path.name}: row {row.get('id', row)} lacks {missing}")
        if not row["library"]:
            raise ValueError(f"{path.name}: row {row['id']} names no library function")
    return rows


def chapter_of(row: dict) -> str:
    """``chapters/05_long_context_memory`` (the docname) of a row."""
    return row["chapter"].removesuffix(".ipynb")


def markdown_lines(rows: list[dict], to_root: str) -> list[str]:
    """The index as MyST Markdown: per chapter a header line and one list item per method.
    ``to_root`` is the path from the page to the repository root ("../" for book/)."""
    lines: list[str] = []
    chapters = list(dict.fromkeys(chapter_of(r) for r in rows))
    for chapter in chapters:
        folder = f"ch{Path(chapter).name[:2]}"
        lines += [f"{{doc}}`{to_root}{chapter}` · graded exercises: "
                  f"`exercises/{folder}/student/{folder}_exercises.ipynb`", ""]
        for row in (r for r in rows if chapter_of(r) == chapter):
            library = ", ".join(f"`{name.removeprefix('xfam_lib.')}`" for name in row["library"])
            test = row["test"].removeprefix("tests/")
            exercise = f" · exercise `{row['exercise'].split('/')[1]}`" if row["exercise"] else ""
            lines.append(f"- {{ref}}`{row['method']} <{row['section']}>`: {library} · test `{test}`{exercise}")
        lines.append("")
    return lines


class MethodIndex(SphinxDirective):
    required_arguments = 1  # the YAML file, relative to the page

    def run(self) -> list[nodes.Node]:
        page = Path(self.env.doc2path(self.env.docname))
        path = (page.parent / self.arguments[0]).resolve()
        self.env.note_dependency(str(path))
        rows = load_rows(path)
        to_root = "../" * (len(Path(self.env.docname).parts) - 1)
        container = nodes.container(classes=["method-index"])
        self.state.nested_parse(StringList(markdown_lines(rows, to_root), source=str(path)),
                                self.content_offset, container)
        return [container]


def setup(app):
    app.add_directive("method-index", MethodIndex)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
