"""Give the chapters' figures real captions and alt text in the HTML.

A chapter draws a figure in a code cell and explains it in the Markdown cell right after, which
starts with ``**Figure N.M.**`` (or the cell prints that paragraph itself, after the image). This extension turns that pair into one figure: the cell's
image (the last one, when a cell draws several) goes into a ``figure`` node whose caption is
that paragraph, and whose alt text is the caption's first sentence instead of the file path.
"""
from __future__ import annotations

import re

from docutils import nodes
from sphinx.transforms.post_transforms import SphinxPostTransform

LABEL = re.compile(r"Figure [A-Z0-9]+\.\d+")


def _previous_block(node: nodes.Node) -> nodes.Node | None:
    """The sibling before ``node``, skipping comments (also HTML ones, which MyST keeps as raw
    nodes: the cells' catalogue IDs live in them) and targets."""
    parent = node.parent
    index = parent.index(node)
    for sibling in reversed(parent.children[:index]):
        if isinstance(sibling, (nodes.comment, nodes.target)) or _is_html_comment(sibling):
            continue
        return sibling
    return None


def _is_html_comment(node: nodes.Node) -> bool:
    return isinstance(node, nodes.raw) and node.astext().strip().startswith("<!--") \
        and node.astext().strip().endswith("-->")


def _alt_text(paragraph: nodes.paragraph) -> str:
    text = " ".join(paragraph.astext().split())
    label, _, rest = text.partition(". ")
    first = re.split(r"(?<=[.!?])\s", rest, maxsplit=1)[0] if rest else label
    return f"{label}: {first}"[:300]


class FigureCaptions(SphinxPostTransform):
    """Runs after MyST-NB has chosen each output's format (its priority 4), so images are final."""

    default_priority = 5

    def run(self, **kwargs) -> None:
        add_captions(self.document)


def add_captions(doctree: nodes.document) -> None:
    for paragraph in list(doctree.findall(nodes.paragraph)):
        first = next((c for c in paragraph.children if c.astext().strip()), None)  # MyST may lead with ""
        if not isinstance(first, nodes.strong) or not LABEL.match(first.astext()):
            continue
        anchor = paragraph  # the caption, or the output that holds it (a cell printing its own caption)
        while _previous_block(anchor) is None and "cell_output" in " ".join(_classes_above(anchor, None)):
            anchor = anchor.parent
        before = _previous_block(anchor)
        images = [] if before is None else [i for i in before.findall(nodes.image)
                                            if "cell_output" in " ".join(_classes_above(i, None))]
        if not images:
            continue
        image = images[-1]
        image["alt"] = _alt_text(paragraph)
        figure = nodes.figure("", classes=["xfam-figure"])
        doctree.set_id(figure)  # a numbered figure needs an id (Sphinx warns "Any IDs not assigned")
        image.replace_self(figure)
        figure += image
        figure += nodes.caption("", "", *paragraph.children)
        paragraph.parent.remove(paragraph)


def _classes_above(node: nodes.Node, stop: nodes.Node) -> list[str]:
    classes = []
    while node is not None and node is not stop:
        classes += node.get("classes", []) if isinstance(node, nodes.Element) else []
        node = node.parent
    return classes


def setup(app):
    app.add_post_transform(FigureCaptions)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
