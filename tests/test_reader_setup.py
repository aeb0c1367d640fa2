"""What a reader who clones the repository does (book/how_to_use.md, "Running locally").

The page tells them to run ``.venv/bin/python -m jupyter lab`` and open a chapter: start that
server headless, open a chapter through it, and check the kernel it would start is this
environment's Python (which has ``xfam_lib`` installed).
"""
from __future__ import annotations

import json
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.read()


def test_running_locally_page_promises_this_command():
    page = (ROOT / "book" / "how_to_use.md").read_text(encoding="utf-8")
    assert ".venv/bin/python -m jupyter lab" in page


def test_jupyter_lab_serves_a_chapter_with_this_environments_kernel(tmp_path):
    port, token = _free_port(), secrets.token_hex(16)
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={ROOT}", "--allow-root"]
    log = (tmp_path / "lab.log").open("w")
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                status, _ = _get(f"{base}/api/status?token={token}")
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("jupyter lab did not start:\n" + (tmp_path / "lab.log").read_text())
                time.sleep(0.5)
        status, page = _get(f"{base}/lab?token={token}")
        assert status == 200 and b"JupyterLab" in page
        chapter = sorted((ROOT / "chapters").glob("*.ipynb"))[0].relative_to(ROOT).as_posix()
        status, body = _get(f"{base}/api/contents/{chapter}?token={token}")
        model = json.loads(body)
        assert model["type"] == "notebook" and model["content"]["cells"], f"could not open {chapter}"
        status, body = _get(f"{base}/api/kernelspecs?token={token}")
        listing = json.loads(body)
        argv0 = listing["kernelspecs"][listing["default"]]["spec"]["argv"][0]
        # jupyter_client replaces a bare "python"/"python3" with the server's own interpreter
        assert argv0 in {"python", "python3"} or Path(argv0).resolve() == Path(sys.executable).resolve(), argv0
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
