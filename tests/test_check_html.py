"""scripts/check_html.py: what it reports for a page's DOM, and what it does without chromium."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("check_html", ROOT / "scripts" / "check_html.py")
check_html = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_html)
summary_spec = importlib.util.spec_from_file_location("summary", ROOT / "scripts" / "summary.py")
summary = importlib.util.module_from_spec(summary_spec)
summary_spec.loader.exec_module(summary)


def page(*figures: str) -> str:
    return "<html><body><mjx-container></mjx-container>" + "".join(figures) + "</body></html>"


def img(shown: float, alt: str = "A heatmap of the weights") -> str:
    return f'<img src="../_images/a.png" alt="{alt}" data-shown="{shown:.3f}">'


def captioned(image: str) -> str:
    return f"<figure>{image}<figcaption>Figure 1.1. Weights.</figcaption></figure>"


def problems(dom: str) -> list[str]:
    return check_html.check_page(dom, Path("x.html"), chapter=False)


def test_a_captioned_full_width_figure_passes():
    assert problems(page(captioned(img(1.0)), captioned(img(0.75)))) == []


def test_a_figure_shown_below_70_percent_fails_and_names_it():
    found = problems(page(captioned(img(1.0)), captioned(img(0.52))))
    assert len(found) == 1 and "below 70%" in found[0] and "2: 52%" in found[0]


def test_a_figure_without_caption_fails():
    found = problems(page(captioned(img(1.0)), img(1.0)))
    assert found == ["1 of 2 figures have no caption"]


def test_a_file_path_as_alt_text_fails():
    found = problems(page(captioned(img(1.0, alt="../_images/a.png"))))
    assert len(found) == 1 and "alt text" in found[0]


def test_code_cells_wider_than_the_measured_column_fail():
    dom = page(captioned(img(1.0))).replace("<body>", '<body data-code-column="73">')
    figures = {}
    assert check_html.check_page(dom, Path("x.html"), chapter=False, figures=figures) == []
    assert figures["code column"] == 73
    cut = dom.replace("</body>", '<pre data-cut="1">x</pre><pre>y</pre></body>')
    found = problems(cut)
    assert len(found) == 1 and found[0].startswith("1 code cells") and "73 characters" in found[0]


def test_without_chromium_the_step_is_skipped_locally(tmp_path, capsys):
    report = tmp_path / "html.xml"
    assert check_html.no_browser(report, required=False) == 0
    assert "SKIPPED" in capsys.readouterr().out
    assert summary.junit_counts(report) == (0, 0, 1)


def test_without_chromium_ci_fails(tmp_path):
    report = tmp_path / "html.xml"
    assert check_html.no_browser(report, required=True) == 1
    assert not report.exists()


def test_ci_run_requires_the_browser():
    assert "export CI=true" in (ROOT / ".ci" / "run").read_text()
