"""The release the notebooks are pinned to, and what the Colab setup cell does when it cannot install.

`_config.yml` names the release (`repository: release:`): Colab installs ``xfam_lib`` at that tag,
the exercise notebooks fetch their public tests from it and the launch buttons open the notebooks
there. It must be a tag of this repository whose ``pyproject.toml`` has that version.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("setup_cell", ROOT / "scripts" / "setup_cell.py")
setup_cell = importlib.util.module_from_spec(spec)
spec.loader.exec_module(setup_cell)


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


def test_release_is_a_tag_of_this_repository_with_that_version():
    release = setup_cell.release()
    assert re.fullmatch(r"v\d+\.\d+\.\d+", release), f"_config.yml release {release!r} is not vX.Y.Z"
    if not git("tag").stdout.split():
        # a clone made without tags (e.g. a CI fetch of one branch) cannot show the release; the
        # check runs wherever tags are present, as in every ordinary clone
        pytest.skip("this clone has no tags at all: `git fetch --tags` to check the release")
    found = git("rev-parse", "--verify", "--quiet", f"refs/tags/{release}^{{commit}}")
    assert found.returncode == 0, (f"_config.yml names release {release}, but this repository has no tag "
                                   f"{release} (tags: {git('tag').stdout.split()}); see the README's "
                                   "'Cutting a release'")
    pyproject = git("show", f"{release}:pyproject.toml")
    assert pyproject.returncode == 0, pyproject.stderr
    version = tomllib.loads(pyproject.stdout)["project"]["version"]
    assert f"v{version}" == release, f"tag {release} has pyproject version {version}"


def test_launch_buttons_open_the_release():
    """Jupyter Book's Colab buttons open ``repository: branch:``; it must be the release."""
    assert setup_cell.repository_value("branch") == setup_cell.release()


LOCAL = f"file://localhost{ROOT.as_posix()}"  # this repository, as git and pip both read it


def run_colab_setup(url: str, tag: str, **env: str) -> subprocess.CompletedProcess:
    """The Colab part of the setup cell, run in a fresh Python that believes it is on Colab."""
    code = ("import sys, types\n"
            "sys.modules['google'] = types.ModuleType('google')\n"
            "sys.modules['google.colab'] = types.ModuleType('google.colab')\n"
            + setup_cell.colab_install_source(url=url, tag=tag))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


def last_line(result: subprocess.CompletedProcess) -> str:
    return result.stderr.strip().splitlines()[-1]


def test_setup_stops_when_the_repository_cannot_be_reached(tmp_path):
    result = run_colab_setup((tmp_path / "nowhere").as_uri(), "v0.3.0")
    assert result.returncode != 0
    assert last_line(result).startswith("RuntimeError: Cannot reach file://"), result.stderr


def test_setup_stops_when_the_release_is_missing():
    result = run_colab_setup(LOCAL, "v0.0.0")
    assert result.returncode != 0
    assert last_line(result) == (f"RuntimeError: {LOCAL} has no release v0.0.0: open this notebook "
                                 "from the book's Colab button, or ask which release to use.")


def test_setup_stops_when_pip_fails(tmp_path):
    """The release exists but pip cannot install it (here: no package index for its build tools)."""
    release = setup_cell.release()
    if git("rev-parse", "--verify", "--quiet", f"refs/tags/{release}").returncode:
        pytest.skip(f"no tag {release} here (test_release_is_a_tag... reports it)")
    result = run_colab_setup(LOCAL, release, PIP_NO_INDEX="1", PIP_FIND_LINKS="",
                             PIP_TARGET=str(tmp_path / "never-used"))
    assert result.returncode != 0
    assert last_line(result).startswith(f"RuntimeError: Installing xfam_lib {release} failed (pip's message"), \
        result.stderr
    assert "did not run successfully" in result.stderr  # pip's own message, printed above it
    assert not (tmp_path / "never-used").exists()


def test_colab_links_in_the_chapters_open_the_release():
    release = setup_cell.release()
    pages = sorted((ROOT / "chapters").glob("*.ipynb")) + sorted((ROOT / "book").glob("*.md"))
    stale = {}
    for page in pages:
        refs = re.findall(r"colab\.research\.google\.com/github/[^/\s]+/[^/\s]+/blob/([^/\s]+)/",
                          page.read_text(encoding="utf-8"))
        if any(ref != release for ref in refs):
            stale[page.name] = sorted(set(refs))
    assert not stale, f"Colab links not at the release {release}: {stale}"
