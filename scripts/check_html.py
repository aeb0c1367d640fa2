"""Open the built book in headless Chromium (offline) and check what a reader sees.

For the index and every chapter page: the page loads; MathJax has typeset its maths (the DOM
holds ``mjx-container`` elements and no raw ``$$``/``\\[``); figures are present (``<img>``
under ``_images/`` whose files exist); no cell shows a traceback; no ipywidget (controls or a
progress bar that cannot work without a kernel) is left on the page; the Colab launch link
points at the chapter's ``.ipynb`` and every other Colab link at a notebook in the repository. Writes a JUnit report so `make test` can count the checks.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HTML = ROOT / "_build" / "html"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--virtual-time-budget=15000", "--dump-dom"]


def rendered_dom(browser: str, page: Path) -> str:
    with tempfile.TemporaryDirectory() as profile:
        result = subprocess.run([browser, *FLAGS, f"--user-data-dir={profile}", page.as_uri()],
                                capture_output=True, text=True, timeout=120)
    if result.returncode != 0 or "<html" not in result.stdout:
        raise AssertionError(f"chromium failed on {page.name}: {result.stderr[-500:]}")
    return result.stdout


def check_page(dom: str, page: Path, *, chapter: bool) -> list[str]:
    problems = []
    body = re.sub(r"<script.*?</script>", "", dom, flags=re.S)
    if "mjx-container" not in dom:
        problems.append("no typeset maths (mjx-container missing: MathJax did not run)")
    if re.search(r"\$\$|\\\[|\\begin\{", re.sub(r"<(pre|code)\b.*?</\1>", "", body, flags=re.S)):
        problems.append("raw TeX left on the page")
    if 'class="output traceback' in dom or "Traceback (most recent call last)" in body:
        problems.append("a cell output shows a traceback")
    if "application/vnd.jupyter.widget-view+json" in dom or "jupyter-widgets" in body:
        problems.append("an ipywidget (controls or a progress bar) is on the static page, where it cannot work")
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--junitxml", type=Path)
    args = parser.parse_args()
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        print("chromium not found: install Debian's chromium package (apt-get install chromium)")
        return 1
    pages = [(HTML / "index.html", False)]
    pages += [(p, True) for p in sorted((HTML / "chapters").glob("*.html"))]
    if not (HTML / "index.html").is_file() or len(pages) < 2:
        print(f"no built book under {HTML}: run `make book` first")
        return 1
    suite = ET.Element("testsuite", name="html", tests=str(len(pages)))
    failures = 0
    for page, chapter in pages:
        case = ET.SubElement(suite, "testcase", classname="html", name=str(page.relative_to(HTML)))
        try:
            problems = check_page(rendered_dom(browser, page), page, chapter=chapter)
        except (AssertionError, subprocess.TimeoutExpired) as exc:
            problems = [str(exc)]
        status = "ok" if not problems else "FAILED: " + "; ".join(problems)
        print(f"{page.relative_to(HTML)}: {status}")
        if problems:
            failures += 1
            ET.SubElement(case, "failure", message="; ".join(problems))
    suite.set("failures", str(failures))
    if args.junitxml:
        args.junitxml.parent.mkdir(parents=True, exist_ok=True)
        ET.ElementTree(suite).write(args.junitxml)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
