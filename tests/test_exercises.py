"""Proofs for the graded exercises of every chapter under ``exercises/`` (DESIGN.md, "Exercises").

For every graded part (otter question) of every master notebook ``exercises/chNN/chNN_exercises.ipynb``:

* the solution scores full marks under the judge, and passes its public tests;
* the untouched student stub scores 0 and fails its public tests cleanly (``NotImplementedError``);
* every wrong answer in ``exercises/chNN/wrong_answers.py``, and two generic ones made here (an
  exception; an endless loop, stopped by the time limit), scores 0 with a clear message, **and
  fails a public test**: every requirement a question states is in a public check;
* a stub in one part costs no other part anything;
* taking an off-limits name from the library (however spelled) scores the part 0.

The judge checks run in this process (`Judge.grade_namespace`: the judge's own cases, expected
values and comparisons, with the tripwires armed), which keeps them fast. End to end,
``exercises/grade.py`` grades four files per chapter in sandboxed runners: the master notebook
(full marks), the untouched student notebook (0), a notebook of wrong answers (0) and a file that
is not a notebook (0). Attacks on the grader are in tests/test_grading.py.

Also checked: the committed student folder equals a fresh build, nothing hidden reaches it, each
master follows the grading policy (`build.validate_master`), and the student notebook's texts,
links and metadata. Everything is built into pytest's temporary directory, so a fresh clone
without ``_build/`` works.
"""
from __future__ import annotations

import csv
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch

pytestmark = pytest.mark.filterwarnings("ignore:Traits should be given as instances:DeprecationWarning")

ROOT = Path(__file__).resolve().parent.parent
ENDLESS_LOOP_LIMIT = 0.1          # seconds: the time limit used to stop the endless-loop answers quickly


def _load(name: str, path: Path):
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


build = _load("xfam_exercises_build", ROOT / "exercises" / "build.py")
CHAPTERS = build.chapters()
QUESTIONS = {ch: build.parse_master(build.master_path(ch)) for ch in CHAPTERS}


def wrong_answers(chapter: str):
    return _load(f"xfam_{chapter}_wrong_answers", ROOT / "exercises" / chapter / "wrong_answers.py")


def _question(chapter: str, name: str):
    return next(q for q in QUESTIONS[chapter] if q.name == name)


def _variants():
    for ch in CHAPTERS:
        listed = wrong_answers(ch).WRONG_ANSWERS
        for q in QUESTIONS[ch]:
            for variant in ["solution", "stub", "exception", "endless_loop", *listed.get(q.name, {})]:
                yield pytest.param(ch, q.name, variant, id=f"{ch}-{q.name}-{variant}")


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """``built(chapter)``: otter assign of that chapter into a temporary folder (once per session)."""
    done = {}

    def get(chapter):
        if chapter not in done:
            done[chapter] = build.assign(chapter, tmp_path_factory.mktemp(chapter) / "out")
        return done[chapter]

    return get


@pytest.fixture(scope="session")
def judge(built):
    """``judge(chapter)``: the judge of that chapter's autograder (cases and expected values collected once)."""
    from xfam_grading import Judge, Limits

    done = {}

    def get(chapter):
        if chapter not in done:
            done[chapter] = Judge.from_autograder(built(chapter).zip_path, isolation="basic")
        return done[chapter]

    return get


_namespaces: dict[tuple[str, str], dict] = {}


def namespace(chapter: str, which: str, built) -> dict:
    """The globals of the master's answers (``solution``) or the student notebook's (``stub``)."""
    key = (chapter, which)
    if key not in _namespaces:
        path = build.master_path(chapter) if which == "solution" else built(chapter).student_dir / f"{chapter}_exercises.ipynb"
        env = {"__name__": f"xfam_{chapter}_{which}"}
        for source in build.program_cells(path, chapter):
            exec(compile(source, f"<{chapter} {which}>", "exec"), env)
        _namespaces[key] = env
    return dict(_namespaces[key])


def _generic(question, env: dict, kind: str) -> dict:
    """Replace every function and class the answer defines by one that raises or never returns."""
    def misbehave(*args, **kwargs):
        if kind == "exception":
            raise RuntimeError("deliberate failure in a wrong submission")
        while True:
            pass

    replaced = {}
    for name in build.answer_names(question):
        original = env[name]
        if type(original).__module__.startswith("triton."):    # a kernel function: misbehave inside Triton
            import triton
            import triton.language as tl

            body = ("    tl.static_assert(False, 'deliberate RuntimeError in a wrong submission')" if kind == "exception"
                    else "    while True:\n        pass")
            scope = {"triton": triton, "tl": tl}
            exec(compile(f"@triton.jit\ndef misbehave(*args):\n{body}\n", "<a wrong kernel>", "exec"), scope)
            replaced[name] = scope["misbehave"]
        elif isinstance(original, type):
            replaced[name] = type(name, (original,), {"__init__": misbehave, "forward": misbehave})
        else:
            replaced[name] = misbehave
    return replaced


def public_results(test_file: Path, env: dict):
    """The student's ``grader.check`` of one part: otter runs its public test file on ``env``."""
    from otter.test_files import ExceptionTestFile

    from xfam_grading.otter_plugin import trim_otter_message

    tests = ExceptionTestFile.from_file(str(test_file))
    tests.run(env)
    return [(r.passed, trim_otter_message(r.message)) for r in tests.test_case_results]


# ----------------------------------------------------------------------------- the master and the built folders
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_master_follows_the_grading_policy(chapter):
    """Public tests worth 0, hidden tests > 0, parts independent; canonical setup cell; Colab GPU; no outputs."""
    master = build.master_path(chapter)
    questions = build.validate_master(master)
    groups = {q.group for q in questions}
    assert 3 <= len(groups) <= 6, f"{chapter}: DESIGN.md asks for 3-6 graded questions, found {sorted(groups)}"
    nb = nbformat.read(master, as_version=4)
    assert nb.cells[0].source == build.setup_cell_source(chapter), "run exercises/build.py to refresh the setup cell"
    assert all(nb.metadata.get(k) == v for k, v in build.COLAB_METADATA.items()), "run exercises/build.py"
    stored = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not stored, f"{master.name} is stored with outputs in cells {stored}"


def test_setup_cell_is_pinned_to_the_release():
    """The Colab install line and the public tests a student fetches name the release; xfam_lib.__version__ says which."""
    import tomllib

    import xfam_lib

    release = build.release()
    assert release == f"v{xfam_lib.__version__}", (release, xfam_lib.__version__)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert pyproject["project"]["version"] == xfam_lib.__version__
    source = build.setup_cell_source("ch01")
    assert f'URL, RELEASE = "{build.repository_url()}", "{release}"' in source
    assert 'XFAM = f"xfam_lib @ git+{URL}@{RELEASE}"' in source
    assert '"--branch", RELEASE' in source and '"main"' not in source


def test_the_exercise_setup_replaces_nothing_colab_ships():
    """On Colab, grader.check gets otter and the few packages its check API needs that Colab lacks, all
    with --no-deps (so pip changes none of Colab's packages), and the cell says in one line what it
    installed; xfam_lib's own install line names no grading package."""
    source = build.setup_cell_source("ch03")
    grading = source[source.index("# grader.check"):source.index("import os\nif")]
    pins = build.check_requirements()
    assert pins[0] == build.otter_requirement() and all(p.count("==") == 1 for p in pins), pins
    assert '"--no-deps"' in grading and all(f'"{p}"' in grading for p in pins), grading
    assert grading.count("print(") == 2 and "installed for grader.check" in grading    # pip's error, or the one line
    install = source[:source.index("# grader.check")]
    assert "otter" not in install and "xfam_grading" not in install, install


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_committed_student_folder_is_up_to_date(chapter, built):
    committed = ROOT / "exercises" / chapter / "student"
    diffs = build.folder_differences(committed, built(chapter).student_dir)
    assert not diffs, f"exercises/{chapter}/student is stale ({diffs}); run `make exercises` and commit it"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_hidden_tests_and_solutions_stay_out_of_the_student_folder(chapter, built):
    b = built(chapter)
    student_text = "\n".join(p.read_text(encoding="utf-8") for p in b.student_dir.rglob("*") if p.is_file())
    assert not re.search(r"^\s*#\s*HIDDEN\b", student_text, flags=re.M | re.I), "a # HIDDEN test reached the students"
    assert "hidden=True" not in student_text, "a hidden test case reached the student tests"
    for q in QUESTIONS[chapter]:
        for test in q.tests:
            in_autograder = test.function in (b.autograder_dir / "tests" / f"{q.name}.py").read_text(encoding="utf-8")
            assert in_autograder, f"{test.function} is missing from the autograder tests"
            if test.hidden:
                assert test.function not in student_text, f"hidden test {test.function} leaked to the student folder"
        leaked = [line for line in _solution_lines(q) if line in student_text]
        assert not leaked, f"{q.name}: solution lines in the student notebook: {leaked}"


def _solution_lines(question) -> list[str]:
    """Distinctive code lines between ``# BEGIN SOLUTION`` and ``# END SOLUTION`` in the answer cells."""
    lines, inside = [], False
    for source in question.answers:
        for line in source.splitlines():
            stripped = line.strip()
            if stripped.startswith("# BEGIN SOLUTION"):
                inside = True
            elif stripped.startswith("# END SOLUTION"):
                inside = False
            elif inside and len(stripped) > 20 and not stripped.startswith("#"):
                lines.append(stripped)
    return lines


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_student_notebook_texts_links_and_metadata(chapter, built):
    """Links reach the chapter at the release; otter's texts say what they do; Colab opens it on a GPU."""
    nb = nbformat.read(built(chapter).student_dir / f"{chapter}_exercises.ipynb", as_version=4)
    markdown = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    links = re.findall(r"\]\(([^)]*chapters/[^)]*)\)", markdown)
    assert links, "the student notebook does not link to its chapter"
    for link in links:
        _resolve(link)
    questions = [c.source for c in nb.cells if c.cell_type == "markdown" and c.source.startswith("## Question")]
    linked = [q for q in questions if re.search(r"In the chapter: \[[^]]+\]\([^)#]+#[\w-]+\)", q)]
    assert len(linked) == len(questions), f"only {len(linked)} of {len(questions)} questions link their section"
    assert "all of the autograder tests" not in markdown and build.CHECK_ALL_TEXT in markdown
    assert nb.cells[1].source == build.INIT_SOURCE
    assert all(nb.metadata.get(k) == v for k, v in build.COLAB_METADATA.items())
    checks = [c.source for c in nb.cells if c.cell_type == "code" and c.source.startswith("grader.check(")]
    assert checks == [f'grader.check("{q.name}")' for q in QUESTIONS[chapter]], "one check cell per graded part"


def _resolve(link: str) -> None:
    """A chapter link is the published book's page or the chapter on GitHub at the release tag, and its
    anchor is one that page gives a heading of the chapter (Sphinx ids for the book, GitHub's for GitHub)."""
    page, _, anchor = link.partition("#")
    github = f"{build.repository_url()}/blob/{build.release()}/chapters/"
    if page.startswith(github):
        notebook, slug = page[len(github):], build.github_anchor
    else:
        assert build.book_url() and page.startswith(f"{build.book_url()}/chapters/") and page.endswith(".html"), link
        notebook, slug = page.rsplit("/", 1)[-1].replace(".html", ".ipynb"), build._sphinx_anchor
    assert (ROOT / "chapters" / notebook).is_file(), f"{link} names no chapter"
    assert not anchor or anchor in [slug(title) for _, title, _, _ in build.chapter_sections(notebook)], \
        f"{link}: no heading of {notebook} has this anchor"


QUESTION_SECTIONS = {            # sections a reader of the question needs, checked by hand against the chapters
    ("ch07", 2): ["7.2"], ("ch10", 2): ["10.2"], ("ch10", 4): ["10.7", "10.8"], ("ch08", 1): ["8.6"],
    ("ch08", 4): ["8.9"], ("ch08", 6): ["8.8"],
    # chapter 5: Transformer-XL's memory and its mask (5.2), the Compressive Transformer (5.3), kNN-LM
    # (5.4), Titans (5.7), the Memorizing Transformer (5.6)
    ("ch05", 1): ["5.2"], ("ch05", 2): ["5.3"], ("ch05", 3): ["5.4"], ("ch05", 4): ["5.7"], ("ch05", 5): ["5.2"],
    ("ch05", 6): ["5.6"],
}


@pytest.mark.parametrize("chapter, number", list(QUESTION_SECTIONS))
def test_a_question_links_to_the_section_it_is_about(chapter, number, built):
    nb = nbformat.read(built(chapter).student_dir / f"{chapter}_exercises.ipynb", as_version=4)
    cell = next(c.source for c in nb.cells if c.cell_type == "markdown" and c.source.startswith(f"## Question {number}."))
    shown = re.findall(r"In the chapter: (.*)", cell)[0]
    assert re.findall(r"\[(\d+\.\d+) ", shown) == QUESTION_SECTIONS[chapter, number], shown


def _check_html():
    return _load("xfam_check_html", ROOT / "scripts" / "check_html.py")


def _fake_book(folder: Path, notebooks: list[str], drop: str = "") -> Path:
    """A built book with only ``notebooks``' pages: each heading in a ``<section>`` whose id the book build
    gives it (as Jupyter Book's HTML has it), except the section titled ``drop``."""
    for notebook in notebooks:
        sections = "".join(f'<section id="{anchor}">\n<h{level}>{title}<a class="headerlink" href="#{anchor}" '
                           f'title="Link to this heading">#</a></h{level}>\n<p>text</p>\n'
                           for level, title, anchor, _ in build.chapter_sections(notebook) if title != drop)
        page = folder / "chapters" / notebook.replace(".ipynb", ".html")
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text(f"<html><body>{sections}</body></html>", encoding="utf-8")
    return folder


def test_the_exercise_link_check_resolves_pages_anchors_and_sections(tmp_path):
    """scripts/check_html.py's check of the exercise links on a built book (here a fake one of chapter 7's
    page): the student notebook's links resolve; a page or an anchor the book lacks, a link shown as
    another section than it lands on, and a link that does not open where students read are named."""
    check = _check_html()
    chapter = "07_sparse_attention.ipynb"
    student = ROOT / "exercises" / "ch07" / "student" / "ch07_exercises.ipynb"
    assert check.exercise_links(student)
    assert check.exercise_link_problems(_fake_book(tmp_path / "good", [chapter]), [student]) == []
    title = next(t for _, t, _, _ in build.chapter_sections(chapter) if t.startswith("7.2 "))
    problems = check.exercise_link_problems(_fake_book(tmp_path / "dropped", [chapter], drop=title), [student])
    assert problems and all(f"no id {build._sphinx_anchor(title)!r}" in p for p in problems), problems
    assert check.exercise_link_problems(tmp_path / "empty", [student])[0].endswith(
        "the built book has no page chapters/07_sparse_attention.html")
    other = next(t for _, t, _, _ in build.chapter_sections(chapter) if t.startswith("7.3 "))
    bad = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(
        f"[{other}]({build.chapter_url(chapter, title)}) [Chapter 7](../../chapters/{chapter}) "
        f"[7.2]({build.repository_url()}/blob/main/chapters/{chapter})")])
    nbformat.write(bad, tmp_path / "bad.ipynb")
    problems = check.exercise_link_problems(tmp_path / "good", [tmp_path / "bad.ipynb"])
    assert len(problems) == 3, problems
    assert f"is the section {title!r}, not 7.3" in problems[0], problems
    assert all("does not open where students read" in p for p in problems[1:]), problems


@pytest.mark.skipif(not (ROOT / "_build" / "html" / "index.html").is_file(), reason="no built book (make book)")
def test_every_exercise_link_resolves_against_the_built_book():
    check = _check_html()
    assert check.exercise_link_problems(ROOT / "_build" / "html", check.student_notebooks()) == []


def test_chapter_links_follow_where_the_book_is_published(monkeypatch):
    """Until ``html: baseurl:`` is set the chapter on GitHub at the release tag (GitHub's anchors), then
    the published page (the book build's anchors)."""
    title = "8.6 Causal linear attention: parallel, recurrent and chunkwise"
    monkeypatch.setattr(build, "book_url", lambda: "")
    assert build.chapter_url("08_linear_attention.ipynb", title) == (
        f"{build.repository_url()}/blob/{build.release()}/chapters/08_linear_attention.ipynb"
        "#86-causal-linear-attention-parallel-recurrent-and-chunkwise")
    monkeypatch.setattr(build, "book_url", lambda: "https://example.org/book")
    assert build.chapter_url("08_linear_attention.ipynb", title) == ("https://example.org/book/chapters/"
                                                                    "08_linear_attention.html#causal-linear-attention-"
                                                                    "parallel-recurrent-and-chunkwise")
    _resolve(build.chapter_url("08_linear_attention.ipynb", title))


# ----------------------------------------------------------------------------- every part against good and bad answers
@pytest.mark.parametrize("chapter, question, variant", list(_variants()))
def test_part_grades_correctly(chapter, question, variant, built, judge, monkeypatch):
    """The judge's hidden checks and the student's public checks agree with what the answer deserves."""
    import xfam_grading.checks
    from xfam_grading import Limits

    q = _question(chapter, question)
    j = judge(chapter)
    env = namespace(chapter, "stub" if variant == "stub" else "solution", built)
    keyword = {"stub": "NotImplementedError", "exception": "RuntimeError", "endless_loop": "time limit"}.get(variant)
    if variant in ("exception", "endless_loop"):
        env.update(_generic(q, env, variant))
    elif variant not in ("solution", "stub"):
        replacements, keyword = wrong_answers(chapter).WRONG_ANSWERS[question][variant]
        assert set(replacements) <= set(build.answer_names(q)), f"{variant} replaces names the answer does not define"
        env.update(replacements)
    saved = j.limits
    if variant == "endless_loop":
        j.limits = Limits(call_seconds=ENDLESS_LOOP_LIMIT)
        monkeypatch.setattr(xfam_grading.checks, "DEFAULT_TIME_LIMIT", ENDLESS_LOOP_LIMIT)
    try:
        verdict = j.grade_namespace(env, [question]).questions[question]
    finally:
        j.limits = saved
    public = public_results(built(chapter).student_dir / "tests" / f"{question}.py", env)
    summary = "\n".join(f"{'PASS' if t.passed else 'FAIL'} {t.name}: {t.message}" for t in verdict.tests)
    public_summary = "\n".join(f"{'PASS' if ok else 'FAIL'}: {m}" for ok, m in public)
    for ok, message in public:
        assert ok or not re.search(r"Error at line \d+ in test", message), message
    if variant == "solution":
        assert verdict.score == verdict.possible > 0 and not verdict.violations, summary
        assert all(ok for ok, _ in public), public_summary
        return
    assert verdict.score == 0 and not any(t.passed for t in verdict.tests if t.hidden), summary
    assert not any(ok for ok, _ in public), f"a public check misses {variant}:\n{public_summary}"
    hidden = [t for t in verdict.tests if t.hidden]
    assert all(re.search(r"\] (case|every case|\d+ of \d+ cases)", t.message) for t in hidden), summary
    if variant in ("stub", "exception", "endless_loop"):
        assert all(keyword in t.message for t in verdict.tests), summary
        assert all(keyword in m for _, m in public), public_summary
    else:
        assert any(keyword in t.message for t in hidden), f"no message mentions {keyword!r}:\n{summary}"
    if (chapter, question, variant) == ("ch10", "q4a", "no_baseline"):     # named, not taken for a scale
        assert not any("look for a scale" in t.message for t in verdict.tests), summary


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_a_stub_costs_only_its_own_part(chapter, built, judge):
    """With every other part left as the stub, each part still earns all its points."""
    solution, stub = namespace(chapter, "solution", built), namespace(chapter, "stub", built)
    for q in QUESTIONS[chapter]:
        env = dict(stub)
        env.update({name: solution[name] for name in build.answer_names(q)})
        verdict = judge(chapter).grade_namespace(env, [q.name]).questions[q.name]
        assert verdict.score == verdict.possible, (q.name, [t.message for t in verdict.tests if not t.passed])



CALLS_ANOTHER_PART = {          # a right answer that calls another part's answer, as the prompts invite
    # (chapter, part, the name it calls, that name's part): the answer (None: the master's own calls it)
    ("ch01", "q4b", "shift_right", "q4a"): (
        "def teacher_forcing_loss(model, src, tgt, bos_id):\n"
        "    logits = model(src, shift_right(tgt, bos_id))\n"
        "    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))\n"),
    ("ch01", "q4c", "shift_right", "q4a"): (
        "def sequential_loss(model, src, tgt, bos_id):\n"
        "    tgt_in = shift_right(tgt, bos_id)\n"
        "    losses = [F.cross_entropy(model(src, tgt_in[:, :t + 1])[:, -1], tgt[:, t], reduction='none')\n"
        "              for t in range(tgt.shape[1])]\n"
        "    return torch.stack(losses, dim=1).mean()\n"),
    ("ch02", "q3b", "sdpa", "q1a"): (
        "def mha_reshape(x, W_q, W_k, W_v, W_o, b_q, b_k, b_v, b_o, n_heads, mask=None):\n"
        "    b, length, d = x.shape\n"
        "    def split(t):\n"
        "        return t.view(b, length, n_heads, d // n_heads).transpose(1, 2)\n"
        "    heads = sdpa(split(x @ W_q + b_q), split(x @ W_k + b_k), split(x @ W_v + b_v), mask)[0]\n"
        "    return heads.transpose(1, 2).reshape(b, length, d) @ W_o + b_o\n"),
    ("ch02", "q3a", "sdpa", "q1a"): (
        "def mha_loop(x, W_q, W_k, W_v, W_o, b_q, b_k, b_v, b_o, n_heads, mask=None):\n"
        "    d_h = x.shape[-1] // n_heads\n"
        "    heads = []\n"
        "    for h in range(n_heads):\n"
        "        c = slice(h * d_h, (h + 1) * d_h)\n"
        "        heads.append(sdpa(x @ W_q[:, c] + b_q[c], x @ W_k[:, c] + b_k[c], x @ W_v[:, c] + b_v[c], mask)[0])\n"
        "    return torch.cat(heads, dim=-1) @ W_o + b_o\n"),
    ("ch03", "q1b", "qk_variance", "q1a"): (
        "def scaled_variance(d_k, alpha, mean=0.0, var=1.0):\n"
        "    return qk_variance(d_k, mean, var) / float(d_k) ** (2 * alpha)\n"),
    ("ch03", "q3b", "logn_factor", "q3a"): (
        "def logn_attention(q, k, v, train_len):\n"
        "    scale = logn_factor(k.shape[-2], train_len) / math.sqrt(q.shape[-1])\n"
        "    return torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1) @ v\n"),
    ("ch03", "q4b", "kv_cache_bytes", "q4a"): (
        "def max_context(memory_bytes, n_layers, n_kv_heads, d_head, batch=1, bytes_per_element=2):\n"
        "    return memory_bytes // kv_cache_bytes(n_layers, n_kv_heads, d_head, 1, batch, bytes_per_element)\n"),
    ("ch03", "q5b", "repeat_kv", "q5a"): (
        "def gqa_attention(q, k, v, causal=False):\n"
        "    n_rep = q.shape[1] // k.shape[1]\n"
        "    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)\n"
        "    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])\n"
        "    if causal:\n"
        "        lq, lk = q.shape[-2], k.shape[-2]\n"
        "        allowed = torch.arange(lk) <= torch.arange(lq).unsqueeze(-1) + (lk - lq)\n"
        "        scores = scores.masked_fill(~allowed, float('-inf'))\n"
        "    return torch.softmax(scores, dim=-1) @ v\n"),
    ("ch04", "q3b", "alibi_slopes", "q3a"): None,
    ("ch04", "q5b", "da_weight", "q5a"): None,
}


def test_every_part_a_prompt_invites_to_call_is_in_the_proofs():
    """Each "you may call your `name`" (or "use your") of a part's prompt, or of its question's shared text
    (``## Question N.``), that names an earlier part's answer is a pair of `CALLS_ANOTHER_PART`."""
    invite = r"\bmay (?:call|use) your `(\w+)`"
    invited = set()
    for chapter in CHAPTERS:
        questions = QUESTIONS[chapter]
        owner = {name: q.name for q in questions for name in build.answer_names(q)}
        order = [q.name for q in questions]
        shared = {}
        for cell in nbformat.read(build.master_path(chapter), as_version=4).cells:
            heading = re.match(r"## Question (\d+)\.", cell.source) if cell.cell_type == "markdown" else None
            if heading:
                shared[f"q{heading.group(1)}"] = cell.source
        for q in questions:
            for name in re.findall(invite, (q.prompt + shared.get(q.group, "")).replace("\n", " ")):
                if name in owner and order.index(owner[name]) < order.index(q.name):
                    invited.add((chapter, q.name, name, owner[name]))
    assert invited and invited <= set(CALLS_ANOTHER_PART), sorted(invited - set(CALLS_ANOTHER_PART))


def _calling_answer(chapter: str, part: str, env: dict) -> None:
    """Put the right answer of ``part`` that calls another part's name into ``env`` (its globals)."""
    source = CALLS_ANOTHER_PART[next(key for key in CALLS_ANOTHER_PART if key[:2] == (chapter, part))]
    if source is None:
        source = "\n\n".join(_question(chapter, part).answers)
    exec(compile(source, f"<{chapter} {part} cell>", "exec"), env)


@pytest.mark.parametrize("chapter, part, callee, callee_part", list(CALLS_ANOTHER_PART))
def test_a_part_that_calls_another_part_is_graded_on_its_own(chapter, part, callee, callee_part, built, judge):
    """A right part that calls another part's answer earns all its points whatever that answer is: the
    stub (the part is attempted), or every wrong answer of that part, which raises nothing (the judge
    checks it with the other part's reference). Without the references (an older autograder) the stub's
    error costs it, and its why column names the part the error came from."""
    j = judge(chapter)
    env = namespace(chapter, "stub", built)
    _calling_answer(chapter, part, env)
    verdict = j.grade_namespace(env, [part]).questions[part]
    assert verdict.score == verdict.possible > 0 and verdict.attempted, verdict.message()
    for variant, (replacements, _) in wrong_answers(chapter).WRONG_ANSWERS[callee_part].items():
        env = namespace(chapter, "solution", built)
        env.update(replacements)
        _calling_answer(chapter, part, env)
        report = j.grade_namespace(env, [callee_part, part])
        assert report.questions[callee_part].score == 0, variant
        assert report.questions[part].score == report.questions[part].possible, (variant, report.questions[part].message())
    env = namespace(chapter, "stub", built)
    _calling_answer(chapter, part, env)
    saved, j.references = j.references, {}
    try:
        verdict = j.grade_namespace(env, [part]).questions[part]
    finally:
        j.references = saved
    assert verdict.score == 0 and verdict.attempted, verdict.message()
    assert f"raised in {callee} ({callee_part})" in verdict.message(), verdict.message()


def _off_limits_cases():
    """(chapter, part, an off-limits callable): a module entry stands for its first public member."""
    from xfam_grading.guard import expand_off_limits

    for ch in CHAPTERS:
        for q in QUESTIONS[ch]:
            for name in q.off_limits:
                member = min(expand_off_limits({q.name: [name]}))
                yield pytest.param(ch, q.name, member, id=f"{ch}-{q.name}-{member.rsplit('.', 1)[-1]}")


@pytest.mark.parametrize("chapter, question, name", list(_off_limits_cases()))
def test_off_limits_names_are_caught_however_spelled(chapter, question, name, judge):
    """Import, alias, attribute access and getattr of a string built at run time: the part scores 0."""
    module, _, leaf = name.rpartition(".")
    half = len(leaf) // 2
    spellings = [
        f"from {module} import {leaf} as mine",
        f"import {module} as lib\nmine = lib.{leaf}",
        f"import importlib\nmine = getattr(importlib.import_module({module!r}), {leaf[:half]!r} + {leaf[half:]!r})",
    ]
    j = judge(chapter)
    for cell in spellings:
        violations, flags = j.scan([cell])
        assert question in violations and name in violations[question][0], (cell, violations)


# ----------------------------------------------------------------------------- end to end with the sandboxed runner
def wrong_notebook(chapter: str, student_nb: Path, out: Path) -> None:
    """The student notebook with each part's answer cell replaced by its TAMPER_BASE wrong answer."""
    nb = nbformat.read(student_nb, as_version=4)
    module_path = ROOT / "exercises" / chapter / "wrong_answers.py"
    module = wrong_answers(chapter)
    answer_cells = [c for c in nb.cells if "otter_answer_cell" in c.metadata.get("tags", [])]
    owners = [q for q in QUESTIONS[chapter] for _ in q.answers]
    assert len(answer_cells) == len(owners)
    for cell, q in zip(answer_cells, owners):
        variants = module.WRONG_ANSWERS[q.name]
        variant = module.TAMPER_BASE if module.TAMPER_BASE in variants else next(iter(variants))
        cell.source += "\n\n" + "\n".join(f"{n} = WRONG_ANSWERS[{q.name!r}][{variant!r}][0][{n!r}]"
                                           for n in variants[variant][0])
    nb.cells.insert(2, nbformat.v4.new_code_cell(module_path.read_text(encoding="utf-8")))
    nbformat.write(nb, out)


def _master_with_off_limits(chapter: str, out: Path) -> tuple[str, str] | None:
    """The master with the first off-limits name of its first part that has one imported in that part's
    answer cell; returns ``(part, name)`` (None for a chapter without off-limits names)."""
    from xfam_grading.guard import expand_off_limits

    part = next((q for q in QUESTIONS[chapter] if q.off_limits), None)
    if part is None:
        return None
    name = min(expand_off_limits({part.name: part.off_limits[:1]}))
    module, _, leaf = name.rpartition(".")
    nb = nbformat.read(build.master_path(chapter), as_version=4)
    start = next(i for i, c in enumerate(nb.cells) if c.cell_type == "raw" and f"name: {part.name}\n" in c.source)
    cell = next(c for c in nb.cells[start:] if c.cell_type == "code")
    cell.source = f"from {module} import {leaf}\n" + cell.source
    nbformat.write(nb, out)
    return part.name, name


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_grading_end_to_end(chapter, built, tmp_path):
    """grade.py: master full marks; untouched, wrong and broken files 0 with messages; an off-limits name costs
    its own part only, its checks shown beside; the CSV reads without the console; the run finishes."""
    b = built(chapter)
    subs = tmp_path / "submissions"
    subs.mkdir()
    (subs / "master_solution.ipynb").write_bytes(build.master_path(chapter).read_bytes())
    (subs / "student_untouched.ipynb").write_bytes((b.student_dir / f"{chapter}_exercises.ipynb").read_bytes())
    (subs / "not_a_notebook.ipynb").write_text("{ this is not json", encoding="utf-8")
    wrong_notebook(chapter, b.student_dir / f"{chapter}_exercises.ipynb", subs / "wrong_answers.ipynb")
    off_limits = _master_with_off_limits(chapter, subs / "off_limits.ipynb")
    out = tmp_path / f"grades_{chapter}.csv"
    proc = subprocess.run([sys.executable, str(ROOT / "exercises" / "grade.py"), chapter, str(subs), "--out", str(out),
                           "--autograder", str(b.zip_path), "--jobs", "2", "--feedback", str(tmp_path / "feedback")],
                          capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = {row["file"]: row for row in csv.DictReader(out.open(encoding="utf-8"))}
    points = {q.name: sum(q.points) for q in QUESTIONS[chapter]}
    score = {q: f"{q} (max {p:g})" for q, p in points.items()}
    assert list(next(iter(rows.values()))) == ["file", *score.values(), "total", "max", "flags",
                                               *(f"{q} why" for q in points), "message"]
    possible = sum(points.values())
    assert all(float(row["max"]) == possible for row in rows.values()), rows
    master = rows["master_solution.ipynb"]
    assert float(master["total"]) == possible and not master["message"] and not master["flags"], master
    assert all(master[score[q]] == f"{p:g}" and not master[f"{q} why"] for q, p in points.items()), master
    student = rows["student_untouched.ipynb"]
    assert float(student["total"]) == 0 and not student["flags"] and not student["message"], student
    assert all(student[score[q]] == "not attempted" and "NotImplementedError" in student[f"{q} why"]
               for q in points), student
    wrong = rows["wrong_answers.ipynb"]
    assert float(wrong["total"]) == 0 and all(wrong[f"{q} why"] for q in points), wrong
    assert all(wrong[score[q]] in ("0", "not attempted") for q in points), wrong    # a part of two names may
    assert any(wrong[score[q]] == "0" for q in points), wrong                     # keep one stub (ch10 q3b)
    broken = rows["not_a_notebook.ipynb"]
    assert float(broken["total"]) == 0 and "not a valid notebook" in broken["message"], broken
    if off_limits:
        part, name = off_limits
        row = rows["off_limits.ipynb"]
        assert float(row["total"]) == possible - points[part] and row[score[part]] == "0", row
        assert f"{part} scores 0 under the off-limits rule" in row[f"{part} why"] and name in row[f"{part} why"], row
        assert row[f"{part} why"].endswith("Its checks pass."), row                     # its own verdict beside
    feedback = (tmp_path / "feedback" / "wrong_answers.txt").read_text(encoding="utf-8")
    assert f"Score 0 / {possible:g}" in feedback


# ----------------------------------------------------------------------------- the second set of attacks, every chapter
def _poisoned(value):
    """``value`` with every floating tensor and float made NaN, and whether anything was."""
    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel():
        return torch.full_like(value, float("nan")), True
    if isinstance(value, float):
        return float("nan"), True
    if isinstance(value, dict):
        pairs = {k: _poisoned(v) for k, v in value.items()}
        return {k: v for k, (v, _) in pairs.items()}, any(hit for _, hit in pairs.values())
    if isinstance(value, (list, tuple)):
        pairs = [_poisoned(v) for v in value]
        return type(value)(v for v, _ in pairs), any(hit for _, hit in pairs)
    return value, False


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_nan_outputs_fail_every_check(chapter, built, judge):
    """Every check of every chapter, default or property check, fails the solution's outputs made NaN
    (a property check written `if error > tol` would pass them)."""
    import copy

    from xfam_grading.checks import _judge_case
    from xfam_grading.compare import _all_finite
    from xfam_grading.runner import run_task

    j, env, checked = judge(chapter), namespace(chapter, "solution", built), 0
    for task in j.tasks:
        result = run_task(dict(task.spec(j.limits.call_seconds), cases=copy.deepcopy(task.cases)), env, None)
        for param, case, expected, outcome in zip(task.params, task.cases, task.expected, result["results"]):
            assert outcome["ok"], (task.label, param, outcome)
            poisoned, hit = _poisoned(outcome["value"])
            if hit and _all_finite(expected):
                assert _judge_case(task.compare, case, poisoned, expected), (task.label, param)
                checked += 1
    assert checked, f"{chapter}: no check returns floating outputs"


ELSEWHERE = [
    "import einops",                                            # installed for the book's tests only
    "from xfam_lib.testing import _first as helper",           # a private helper of an allowed module
    "import xfam_lib.attention as A\nf = A.softmax_naive",       # the library beyond what the notebook imports
    "%%time\nimport x_transformers",                             # hidden in a cell magic's body
]
INTROSPECTION = [
    "f = lambda: 0\ncells = getattr(f, '__clo' + 'sure__')",
    "f = lambda: 0\ng = f.__globals__",
    "def pick(o, n):\n    return getattr(o, n)",
]


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_answers_from_elsewhere_score_nothing_and_introspection_is_flagged(chapter, judge):
    """On every chapter: a name off the allowlist costs every part; introspection is flagged."""
    from xfam_grading.scanner import _to_python

    j = judge(chapter)
    for cell in ELSEWHERE:
        violations, _ = j.scan([_to_python(cell)])
        assert set(violations) == set(j.questions), (cell, violations)
    for cell in INTROSPECTION:
        violations, flags = j.scan([cell])
        assert flags and not violations, (cell, flags, violations)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_the_masters_and_student_notebooks_scan_clean(chapter, built, judge):
    """The allowlist and the flags leave the book's own answers and the handed-out notebook alone."""
    from xfam_grading import notebook_code_cells
    from xfam_grading.scanner import _to_python

    for path in (build.master_path(chapter), built(chapter).student_dir / f"{chapter}_exercises.ipynb"):
        cells = [_to_python(c) for c in notebook_code_cells(nbformat.read(path, as_version=4))]
        assert judge(chapter).scan(cells) == ({}, []), path


# ----------------------------------------------------------------------------- the off-limits rule as a student meets it
def _with_answer_line(chapter: str, notebook: Path, part: str | None, line: str) -> dict:
    """The notebook with ``line`` added to the answer cell of ``part`` (None: to the imports at the top)."""
    nb = nbformat.read(notebook, as_version=4)
    if part is None:
        cell = next(c for c in nb.cells if c.cell_type == "code" and c.source.startswith("import "))
    else:
        check = next(i for i, c in enumerate(nb.cells) if c.source == f'grader.check("{part}")')
        cell = next(c for c in reversed(nb.cells[:check]) if "otter_answer_cell" in c.metadata.get("tags", []))
    cell.source = line + "\n" + cell.source
    return nb


def _scan_notebook(j, nb) -> dict:
    from xfam_grading.scanner import _to_python, notebook_cell_parts

    pairs = notebook_cell_parts(nb)
    violations, _ = j.scan([_to_python(c) for c, _ in pairs], [p for _, p in pairs])
    return violations


@pytest.mark.parametrize("chapter, line, cell_part, costs", [
    # the cases: one name in one part's cell zeroed every part that listed it
    ("ch08", "from xfam_lib.linear import elu_feature_map", "q1a", set()),         # phi, given by the notebook
    ("ch08", "from xfam_lib.linear import linear_attention", "q1a", {"q1a"}),
    ("ch08", "from xfam_lib.linear import gated_linear_attention", "q1a", set()),   # q1a does not list it
    ("ch07", "from xfam_lib.sparse import strided_mask", "q1a", {"q1a"}),
    ("ch07", "from xfam_lib.sparse.masks import _dca_parts", "q6a", {"q6a"}),      # a listed private helper
    ("ch09", "from xfam_lib.ssm import selective_scan as scan", "q3a", {"q3a"}),
    ("ch09", "from xfam_lib.ssm import selective_scan as scan", "q4a", set()),      # q4a does not list it
    ("ch09", "from xfam_lib.ssm import selective_scan as scan", None, {"q3a", "q4b", "q5a"}),  # no part's cell
    ("ch09", "from xfam_lib.ssm import *", "q1b", {"q1b"}),
    ("ch09", "from xfam_lib.ssm._common import _phi1 as helper", "q1b", {"q1b"}),                # a listed private helper
])
def test_an_off_limits_name_costs_the_part_whose_cell_holds_it(chapter, line, cell_part, costs, built, judge):
    nb = _with_answer_line(chapter, built(chapter).student_dir / f"{chapter}_exercises.ipynb", cell_part, line)
    violations = _scan_notebook(judge(chapter), nb)
    assert set(violations) == costs, violations
    for part in costs:
        module = {"ch07": "xfam_lib.sparse.", "ch08": "xfam_lib.linear.", "ch09": "xfam_lib.ssm."}[chapter]
        assert all(v.startswith("uses " + module)
                   for v in violations[part]), violations


def _phi1_zoh_diagonal(A, B, delta):
    """ch09 q1b answered by the library's private helper: right values, none of the work."""
    from xfam_lib.ssm._common import _phi1

    dA = delta[:, None] * A
    return torch.exp(dA), delta[:, None] * _phi1(dA) * B


def test_a_private_helper_that_solves_a_part_is_off_limits(built, judge):
    """`from xfam_lib.ssm._common import _phi1` answers ch09 q1b; its checks pass, and the part scores 0."""
    env = namespace("ch09", "solution", built)
    env["zoh_diagonal"] = _phi1_zoh_diagonal
    public = public_results(built("ch09").student_dir / "tests" / "q1b.py", env)
    assert all(ok for ok, _ in public), public                  # the values are right: only the rule catches it
    verdict = judge("ch09").grade_namespace(env, ["q1b"]).questions["q1b"]
    assert verdict.score == 0 and any("calls xfam_lib.ssm._common._phi1" in v for v in verdict.violations), verdict


def _check_in_folder(chapter, built, tmp_path, monkeypatch, nb, env, question):
    """``grader.check(question)`` as a student runs it: the notebook and its tests folder in the working folder."""
    import shutil

    from xfam_grading import otter_notebook

    shutil.copytree(built(chapter).student_dir / "tests", tmp_path / "tests")
    nbformat.write(nb, tmp_path / f"{chapter}_exercises.ipynb")
    monkeypatch.chdir(tmp_path)
    return otter_notebook().check(question, env)


def test_grader_check_reports_an_off_limits_name_before_grading(built, tmp_path, monkeypatch):
    """A right answer that imports an off-limits name passes its public test, and grader.check says what it costs."""
    chapter = "ch08"
    nb = _with_answer_line(chapter, built(chapter).student_dir / f"{chapter}_exercises.ipynb", "q1a",
                           "from xfam_lib.linear import linear_attention")
    env = namespace(chapter, "solution", built)
    result = _check_in_folder(chapter, built, tmp_path, monkeypatch, nb, env, "q1a")
    messages = [r.message for r in result.test_case_results]
    assert result.test_case_results[0].passed and not result.passed_all, messages
    assert "q1a would score 0 under the off-limits rule" in messages[-1], messages
    assert "xfam_lib.linear.linear_attention" in messages[-1] and "line 1" in messages[-1], messages
    assert "q1a would score 0" in result._repr_html_(), "the HTML view lost the off-limits note"
    from xfam_grading import otter_notebook

    other = otter_notebook().check("q1b", env)
    assert other.passed_all, [r.message for r in other.test_case_results]        # costs only its own part


def test_grader_check_without_the_tests_folder_says_what_is_missing(built, tmp_path, monkeypatch):
    from xfam_grading import otter_notebook

    (tmp_path / "ch08_exercises.ipynb").write_bytes((built("ch08").student_dir / "ch08_exercises.ipynb").read_bytes())
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as missing:
        otter_notebook().check("q1a", {})
    assert "exercises/ch08/student/tests" in str(missing.value) and "first cell" in str(missing.value), missing.value


def test_every_name_a_question_uses_is_defined():
    """ch11 q1b speaks of `PAD`: the notebook defines it before the questions."""
    nb = nbformat.read(build.master_path("ch11"), as_version=4)
    env = {}
    exec(compile(build.program_cells(nb, "ch11")[0], "<ch11 imports>", "exec"), env)
    assert env["PAD"] == 0 and env["BOS"] == 1


def test_ch03_autograder_installs_triton(built):
    """ch03 q6b writes a Triton kernel, graded in Triton's CPU interpreter: its autograder pins triton from the
    lock file; a notebook that does not import triton does not get it."""
    import zipfile

    assert build.imports_triton(["import math", "import triton.language as tl"])
    assert build.imports_triton(["from triton import cdiv"])
    assert not build.imports_triton(["import torch  # not triton", "name = 'import triton'"])
    pin = next(line.split("#")[0].strip() for line in (ROOT / "requirements-lock.txt").read_text().splitlines()
               if line.startswith("triton=="))
    assert pin in build.grading_requirements(".", triton=True)
    assert not any(r.startswith("triton") for r in build.grading_requirements("."))
    with zipfile.ZipFile(built("ch03").zip_path) as zf:
        assert pin in zf.read("requirements.txt").decode().splitlines()
        assert f"- {pin}" in zf.read("environment.yml").decode()
