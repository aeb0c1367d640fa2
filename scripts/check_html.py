"""Open the built book in headless Chromium (offline, 1280x900 window) and check what a reader sees.

For the index, every chapter page and every page of ``book/``: the page loads; MathJax has typeset
its maths (the DOM holds ``mjx-container`` elements and no raw ``$$``/``\\[``/``$...$``); no
Markdown table is left as pipe text; figures are present (``<img>`` under ``_images/`` whose files
exist); no cell shows a traceback; no ipywidget (controls or a progress bar that cannot work
without a kernel) is left on the page; the Colab launch link points at the chapter's ``.ipynb``
and every other Colab link at a notebook in the repository; every figure has a caption and a real alt text and is shown at 70% of its width or more (the
column is 676 px wide at this window size: a figure drawn wider than about 9.6 in at 100 dpi is
scaled down until its text is too small to read); no visible code cell has lines wider than the code
column, whose width in characters is measured and printed (tests/test_notebook_hygiene.py's
CODE_COLUMN must not exceed it). Writes a JUnit report so `make test` can count
the checks. Without chromium the check is skipped, except under CI.

Before the browser, without it: every chapter link of the exercises' student notebooks resolves
against the built book (`exercise_link_problems`: the page, the anchor's id, the numbered section
it is shown as), reported as a second JUnit file (``html-links.xml``).
"""
from __future__ import annotations

import argparse
import html
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HTML = ROOT / "_build" / "html"
FLAGS = ["--headless", "--no-sandbox", "--window-size=1280,900", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--virtual-time-budget=15000", "--dump-dom"]


# Marks each image with the share of its own width it is shown at (data-shown); the body with the
# number of monospace characters the narrowest code cell holds (data-code-column: folded cells sit
# indented inside their toggle, so they hold fewer than open ones); and each code cell whose lines
# are wider than its column (data-cut), except the setup cell (scripts/setup_cell.py). Read back
# from the DOM.
MEASURE = """<script>window.addEventListener("load", () => { for (const img of document.images)
  img.dataset.shown = img.naturalWidth ? (img.getBoundingClientRect().width / img.naturalWidth).toFixed(3) : "";
  const code = [...document.querySelectorAll("div.cell_input pre")].filter(p => p.clientWidth > 0);
  if (code.length) {
    const probe = document.createElement("span");
    probe.textContent = "x".repeat(100);
    code[0].appendChild(probe);
    const charWidth = probe.getBoundingClientRect().width / 100;
    probe.remove();
    const chars = code.map(pre => { const style = getComputedStyle(pre);
      return Math.floor((pre.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight)) / charWidth); });
    document.body.dataset.codeColumn = Math.min(...chars);
    for (const pre of code)
      if (pre.scrollWidth > pre.clientWidth + 1 && !pre.textContent.startsWith("# Setup (hidden in the book)"))
        pre.dataset.cut = "1";
  }
});</script>"""


def rendered_dom(browser: str, page: Path) -> str:
    probe = page.with_name(page.stem + ".check.html")  # beside the page, so relative links resolve
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", MEASURE + "</body>"), encoding="utf-8")
    try:
        with tempfile.TemporaryDirectory() as profile:
            result = subprocess.run([browser, *FLAGS, f"--user-data-dir={profile}", probe.as_uri()],
                                    capture_output=True, text=True, timeout=120)
    finally:
        probe.unlink()
    if result.returncode != 0 or "<html" not in result.stdout:
        raise AssertionError(f"chromium failed on {page.name}: {result.stderr[-500:]}")
    return result.stdout


def figure_report(dom: str) -> dict:
    """Counts of the page's figures: all, without a caption, shown below 70% of their width."""
    tags = re.findall(r"<img[^>]+_images/[^>]*>", dom)
    captioned = sum(len(re.findall(r"<img[^>]+_images/", block))
                    for block in re.findall(r"<figure\b.*?</figure>", dom, flags=re.S) if "<figcaption" in block)
    shown = [(float(m.group(1)), i) for i, t in enumerate(tags, 1) if (m := re.search(r'data-shown="([\d.]+)"', t))]
    shrunk = sorted((ratio, i) for ratio, i in shown if ratio < 0.7)
    return {"images": len(tags), "uncaptioned": len(tags) - captioned, "below 70%": len(shrunk),
            "alt is a path": sum(bool(re.search(r'alt="[^"]*_images/|alt="[^"]*\.png"', t)) for t in tags),
            "smallest (image number: shown)": ", ".join(f"{i}: {ratio:.0%}" for ratio, i in shrunk[:3])}


def check_page(dom: str, page: Path, *, chapter: bool, maths: bool = True,
               figures: dict | None = None) -> list[str]:
    """What is wrong on ``page``; ``maths``: the page has maths, so MathJax must have typeset some."""
    problems = []
    figures = {} if figures is None else figures
    body = re.sub(r"<script.*?</script>", "", dom, flags=re.S)
    if maths and "mjx-container" not in dom:
        problems.append("no typeset maths (mjx-container missing: MathJax did not run)")
    prose = re.sub(r"<(pre|code|style|mjx-container)\b.*?</\1>", "", body, flags=re.S)
    if re.search(r"\$\$|\\\[|\\begin\{", prose):
        problems.append("raw TeX left on the page")
    text = html.unescape(re.sub(r"<[^>]+>", " ", prose))
    if raw := re.search(r"\$(?=\S)[^$\n]+?(?<=\S)\$(?!\d)", text):  # Pandoc's rule for inline maths
        problems.append(f"raw $...$ maths left on the page: {raw.group()[:60]!r}")
    if raw := re.search(r"\|\s*:?-{3,}:?\s*\|", text):
        problems.append(f"a Markdown table left as text (not rendered): {raw.group()!r}")
    if column := re.search(r'<body[^>]*data-code-column="(\d+)"', dom):
        figures["code column"] = int(column.group(1))
    if cut := len(re.findall(r'<pre[^>]*data-cut="1"', dom)):
        problems.append(f"{cut} code cells have lines wider than the code column "
                        f"({figures.get('code column', '?')} characters at this window size): they are cut")
    if 'class="output traceback' in dom or "Traceback (most recent call last)" in body:
        problems.append("a cell output shows a traceback")
    if "application/vnd.jupyter.widget-view+json" in dom or "jupyter-widgets" in body:
        problems.append("an ipywidget (controls or a progress bar) is on the static page, where it cannot work")
    figures.update(figure_report(dom))
    if figures["uncaptioned"]:
        problems.append(f"{figures['uncaptioned']} of {figures['images']} figures have no caption")
    if figures["below 70%"]:
        problems.append(f"{figures['below 70%']} figures shown below 70% of their width, too small to read "
                        f"(image number: share shown) {figures['smallest (image number: shown)']}")
    if figures["alt is a path"]:
        problems.append(f"{figures['alt is a path']} figures have a file path as alt text")
    if chapter:
        images = re.findall(r'<img[^>]+src="([^"]*_images/[^"]+)"', dom)
        if not images:
            problems.append("no figures (<img> from _images/)")
        for src in images:
            if not (page.parent / src).resolve().is_file():
                problems.append(f"figure file missing: {src}")
        colab = re.findall(r'href="https://colab\.research\.google\.com/github/[^/"]+/[^/"]+/blob/[^/"]+/([^"]+)"', dom)
        if f"chapters/{page.stem}.ipynb" not in colab:
            problems.append(f"no Colab launch link to chapters/{page.stem}.ipynb (links seen: {colab})")
        for target in colab:  # other Colab links (e.g. to the chapter's exercises) must name a notebook that exists
            if not target.endswith(".ipynb") or not (ROOT / target).is_file():
                problems.append(f"Colab link to a notebook that is not in the repository: {target}")
    return problems


# ----------------------------------------------------------------------------- exercise links, against the built book
def _exercises_build():
    """exercises/build.py (where the exercise links are made: `chapter_url`)."""
    import importlib.util

    name = "xfam_exercises_build"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "exercises" / "build.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def exercise_links(notebook: Path) -> list[tuple[str, str]]:
    """``(text, target)`` of every Markdown link of a notebook."""
    import json

    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return re.findall(r"\[([^\]]+)\]\(([^)\s]+)\)", text)


def _section_heading(page_html: str, anchor: str) -> str | None:
    """The text of the heading that the element with id ``anchor`` of a built page starts with ('' if it has
    none), or None if no element has that id."""
    match = re.search(rf'<(\w+)[^>]*\bid="{re.escape(anchor)}"[^>]*>(.*?)</h\d>', page_html, flags=re.S)
    if match is None:
        return None if f'id="{anchor}"' not in page_html else ""
    heading = re.search(r"<h\d[^>]*>(.*)", match.group(2), flags=re.S)
    text = re.sub(r"<a class=\"headerlink\".*?</a>", "", heading.group(1) if heading else "", flags=re.S)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", text)).split())


def exercise_link_problems(built: Path, notebooks: list[Path]) -> list[str]:
    """What is wrong with the chapter links of the student notebooks, resolved against the built book ``built``
    (``_build/html``).

    A link to a chapter is the published page (``html: baseurl:`` of `_config.yml`) or, while the
    book has none, the chapter notebook on GitHub at the release tag (`build.chapter_url`); any other
    link into the repository (a relative one, another branch) is dead where students are. Each is
    mapped back to the built page of its chapter, which must exist; its anchor must be an id on that
    page (a GitHub anchor is first mapped to the heading of the chapter GitHub gives it, then to
    the id the book build gives that heading), and a link shown as a numbered section (``7.2 Local
    attention``) must land on the heading of that section.
    """
    build = _exercises_build()
    github = f"{build.repository_url()}/blob/{build.release()}/chapters/"
    book = f"{build.book_url()}/chapters/" if build.book_url() else None
    problems, pages = [], {}
    for notebook in notebooks:
        for text, target in exercise_links(notebook):
            if "chapters/" not in target or target.startswith("https://colab.research.google.com/"):
                continue
            page, _, anchor = target.partition("#")
            where = f"{notebook.name}: [{text}]({target})"
            if book and page.startswith(book) and page.endswith(".html"):
                name, sphinx = page[len(book):], anchor
            elif not book and page.startswith(github) and page.endswith(".ipynb"):
                name = page[len(github):].removesuffix(".ipynb") + ".html"
                titles = [title for _, title, _, _ in build.chapter_sections(page[len(github):])
                          if build.github_anchor(title) == anchor] if anchor else []
                if anchor and not titles:
                    problems.append(f"{where}: no heading of the chapter has the GitHub anchor #{anchor}")
                    continue
                sphinx = build._sphinx_anchor(titles[0]) if titles else ""
            else:
                problems.append(f"{where}: neither the published book nor the chapter on GitHub at "
                                f"{build.release()}, so it does not open where students read")
                continue
            path = built / "chapters" / name
            if not path.is_file():
                problems.append(f"{where}: the built book has no page chapters/{name}")
                continue
            if path not in pages:
                pages[path] = path.read_text(encoding="utf-8")
            if not sphinx:
                continue
            heading = _section_heading(pages[path], sphinx)
            if heading is None:
                problems.append(f"{where}: chapters/{name} has no id {sphinx!r}")
                continue
            number = re.match(r"(\d+\.\d+) ", text)
            if number and not heading.startswith(number.group(1) + " "):
                problems.append(f"{where}: #{sphinx} is the section {heading!r}, not {number.group(1)}")
    return problems


def student_notebooks() -> list[Path]:
    return sorted((ROOT / "exercises").glob("ch[0-9][0-9]/student/ch[0-9][0-9]_exercises.ipynb"))


def no_browser(junitxml: Path | None, *, required: bool) -> int:
    """Without chromium: a failure under CI (``CI`` set, as `.ci/run` does), else a reported skip."""
    hint = "install Debian's chromium package (apt-get install chromium)"
    if required:
        print(f"chromium not found, and CI requires the browser check: {hint}")
        return 1
    print(f"SKIPPED: chromium not found, so the built HTML was not checked in a browser; {hint} to run it")
    if junitxml:
        suite = ET.Element("testsuite", name="html", tests="1", skipped="1")
        case = ET.SubElement(suite, "testcase", classname="html", name="chromium")
        ET.SubElement(case, "skipped", message="chromium not found")
        junitxml.parent.mkdir(parents=True, exist_ok=True)
        ET.ElementTree(suite).write(junitxml)
    return 0


def check_exercise_links(junitxml: Path | None) -> int:
    """`exercise_link_problems` on the built book, printed and as a JUnit report (``junitxml`` with ``links``
    before its suffix); 1 if a link fails."""
    notebooks = student_notebooks()
    problems = exercise_link_problems(HTML, notebooks)
    count = sum(len(exercise_links(nb)) for nb in notebooks)
    print(f"exercise links: {count} links of {len(notebooks)} student notebooks resolved against {HTML}: "
          + ("ok" if not problems else f"{len(problems)} FAILED"))
    for problem in problems:
        print(f"  {problem}")
    if junitxml:
        suite = ET.Element("testsuite", name="exercise links", tests="1", failures=str(int(bool(problems))))
        case = ET.SubElement(suite, "testcase", classname="html", name="exercise links")
        if problems:
            ET.SubElement(case, "failure", message="; ".join(problems)[:4000])
        junitxml.parent.mkdir(parents=True, exist_ok=True)
        ET.ElementTree(suite).write(junitxml.with_name(junitxml.stem + "-links" + junitxml.suffix))
    return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--junitxml", type=Path)
    args = parser.parse_args()
    if not (HTML / "index.html").is_file():
        print(f"no built book under {HTML}: run `make book` first")
        return 1
    links = check_exercise_links(args.junitxml)       # needs no browser
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        return no_browser(args.junitxml, required=bool(os.environ.get("CI"))) or links
    pages = [(HTML / "index.html", False)]
    pages += [(p, True) for p in sorted((HTML / "chapters").glob("*.html"))]
    pages += [(p, False) for p in sorted((HTML / "book").glob("*.html"))]
    if not (HTML / "index.html").is_file() or len(pages) < 2:
        print(f"no built book under {HTML}: run `make book` first")
        return 1
    suite = ET.Element("testsuite", name="html", tests=str(len(pages)))
    failures, totals, columns = 0, Counter(), []
    for page, chapter in pages:
        case = ET.SubElement(suite, "testcase", classname="html", name=str(page.relative_to(HTML)))
        try:
            maths = chapter or page.parent == HTML  # the front and back matter may have none
            figures = {}
            problems = check_page(rendered_dom(browser, page), page, chapter=chapter, maths=maths,
                                  figures=figures)
            if figures:
                totals.update({k: v for k, v in figures.items() if isinstance(v, int) and k != "code column"})
                if "code column" in figures:
                    columns.append(figures["code column"])
                print(f"  figures: {figures}")
        except (AssertionError, subprocess.TimeoutExpired) as exc:
            problems = [str(exc)]
        status = "ok" if not problems else "FAILED: " + "; ".join(problems)
        print(f"{page.relative_to(HTML)}: {status}")
        if problems:
            failures += 1
            ET.SubElement(case, "failure", message="; ".join(problems))
    print(f"figures: {dict(totals)}")
    if columns:
        print(f"code column: {min(columns)}-{max(columns)} characters (tests/test_notebook_hygiene.py CODE_COLUMN)")
    suite.set("failures", str(failures))
    if args.junitxml:
        args.junitxml.parent.mkdir(parents=True, exist_ok=True)
        ET.ElementTree(suite).write(args.junitxml)
    return 1 if failures or links else 0


if __name__ == "__main__":
    sys.exit(main())
