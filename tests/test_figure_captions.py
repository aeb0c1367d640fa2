"""book/_ext/figure_captions.py: a "**Figure N.M.**" paragraph becomes the caption of the image before it."""
from __future__ import annotations

import importlib.util
from pathlib import Path

from docutils import nodes
from docutils.utils import new_document

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("figure_captions", ROOT / "book" / "_ext" / "figure_captions.py")
figure_captions = importlib.util.module_from_spec(spec)
spec.loader.exec_module(figure_captions)


def cell_with_images(*uris: str) -> nodes.container:
    output = nodes.container(classes=["cell_output"])
    for uri in uris:
        output += nodes.container("", nodes.image(uri=uri), classes=["output"])
    return nodes.container("", nodes.container(classes=["cell_input"]), output, classes=["cell"])


def caption(label: str, text: str) -> nodes.paragraph:
    """A paragraph as MyST parses "**label** text" (it starts with an empty text node)."""
    return nodes.paragraph("", "", nodes.Text(""), nodes.strong(text=label), nodes.Text(text))


def document(*children: nodes.Node) -> nodes.document:
    doc = new_document("test")
    doc += nodes.section("", *children)
    return doc


def test_markdown_caption_after_a_cell_captions_its_last_image():
    doc = document(cell_with_images("_images/a.png", "_images/b.png"),
                   caption("Figure 4.1.", " Each row is one position. The first columns flip."))
    figure_captions.add_captions(doc)
    figures = list(doc.findall(nodes.figure))
    assert len(figures) == 1
    image = figures[0].next_node(nodes.image)
    assert image["uri"] == "_images/b.png"
    assert image["alt"] == "Figure 4.1: Each row is one position."
    assert figures[0].next_node(nodes.caption).astext() == "Figure 4.1. Each row is one position. The first columns flip."
    assert not [p for p in doc.findall(nodes.paragraph) if p.astext().startswith("Figure 4.1.")
                and not isinstance(p.parent, nodes.caption)]


def test_an_html_comment_between_image_and_caption_is_skipped():
    """A caption cell may open with the comment that holds its catalogue IDs (<!-- E5.4 -->)."""
    comment = nodes.raw("", "<!-- E5.4 -->", format="html")
    doc = document(cell_with_images("_images/a.png"), comment, caption("Figure 5.3.", " Mass against age."))
    figure_captions.add_captions(doc)
    (figure,) = doc.findall(nodes.figure)
    assert figure.next_node(nodes.caption).astext().startswith("Figure 5.3.")


def test_caption_printed_by_the_cell_itself():
    output = nodes.container(classes=["cell_output"])
    output += nodes.container("", nodes.image(uri="_images/gla.png"), classes=["output"])
    output += nodes.container("", caption("Figure B.1.", " `bench_gla.py`: a speed-up."), classes=["output"])
    doc = document(nodes.container("", output, classes=["cell"]))
    figure_captions.add_captions(doc)
    (figure,) = doc.findall(nodes.figure)
    assert figure.next_node(nodes.image)["uri"] == "_images/gla.png"
    assert figure.next_node(nodes.caption).astext().startswith("Figure B.1.")


def test_other_paragraphs_and_images_are_left_alone():
    doc = document(cell_with_images("_images/a.png"), caption("Note.", " not a caption"),
                   nodes.paragraph("", "", nodes.strong(text="Figure 2.1."), nodes.Text(" no image before")))
    figure_captions.add_captions(doc)
    assert not list(doc.findall(nodes.figure))
    assert "alt" not in next(doc.findall(nodes.image))
