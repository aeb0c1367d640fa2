"""Print the summary of `make test` from the steps table and the JUnit reports; exit 1 if anything failed."""
from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def junit_counts(path: Path) -> tuple[int, int, int]:
    """(passed, failed, skipped) over every testsuite of a JUnit XML file."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    tests = failed = skipped = 0
    for s in suites:
        tests += int(s.get("tests", 0))
        failed += int(s.get("failures", 0)) + int(s.get("errors", 0))
        skipped += int(s.get("skipped", 0))
    return tests - failed - skipped, failed, skipped


def main(reports: Path) -> int:
    steps = [line.split("\t") for line in (reports / "steps.tsv").read_text().splitlines() if line]
    xml_of = {0: "library.xml", 1: "notebooks.xml", 2: "colab.xml", 4: "html.xml"}
    total_p = total_f = total_s = 0
    print("\n" + "=" * 72 + "\nmake test summary\n" + "=" * 72)
    for i, (name, rc, seconds) in enumerate(steps):
        detail = ""
        xml = reports / xml_of.get(i, "-")
        if xml.is_file():
            p, f, s = junit_counts(xml)
            detail = f"{p} passed, {f} failed" + (f", {s} skipped" if s else "")
        else:
            p, f, s = (1, 0, 0) if rc == "0" else (0, 1, 0)
            detail = "ok" if rc == "0" else f"exit status {rc}"
        if rc != "0" and f == 0:
            f = 1  # the step failed without a failing test case (crash, collection error, build warning)
        total_p, total_f, total_s = total_p + p, total_f + f, total_s + s
        status = "PASS" if rc == "0" else "FAIL"
        print(f"{status}  {name:<58} {detail:<28} {int(seconds):>5d} s")
    total_time = sum(int(s[2]) for s in steps)
    print("-" * 72 + f"\ntotal time {total_time} s")
    print(f"{total_p} passed, {total_f} failed" + (f", {total_s} skipped" if total_s else ""))
    return 1 if total_f else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
