"""The Triton kernels compiled ahead of time for a T4, an A100 and an H100, with no GPU
and no driver (`xfam_lib.kernels._aot`): what a GPU would refuse at launch is known at
compile time.

This runs the cheap subset (`_aot.in_subset`: every kernel's worst case on a T4, the chunked
kernels' heaviest tensor-core products on an H100 and two on an A100), cold, in a
subprocess: this process runs the kernels in Triton's interpreter (tests/conftest.py sets
``TRITON_INTERPRET=1``), where nothing can be compiled. ``make kernel-compile`` runs the full
matrix (every GPU, dtype, head size and autotuning config) and the same checks
(`_aot.problems`).
"""
import json
import os
import subprocess
import sys

import pytest

if sys.platform != "linux":
    pytest.skip("Triton is pinned and tested on Linux only", allow_module_level=True)

from xfam_lib.kernels import _aot


def compile_subset(folder):
    """The subset's compile results, from one run of ``python -m xfam_lib.kernels._aot``."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(folder / "cache")             # cold: a fresh cache per run
    saved = folder / "results.json"
    proc = subprocess.run([sys.executable, "-m", "xfam_lib.kernels._aot", "--subset", "--out",
                           str(saved)], env=env, capture_output=True, text=True, timeout=1800,
                          check=False)                         # exit 1: problems, asserted below
    assert saved.exists(), proc.stderr[-3000:]
    return json.loads(saved.read_text())["results"]


def test_kernels_compile_for_four_gpus(tmp_path):
    """One test (one subprocess, whichever worker runs it): every launch of the subset
    compiles; shared memory within the GPU's limit for every config the wrappers may launch
    (and one at least for every kernel, GPU, dtype and size), registers within what a block
    may hold, the flash prune's estimate never below the compiled size (`_aot.problems`);
    bf16 products of the chunked kernels on tensor cores (``mma`` on an A100, ``mma`` or
    ``wgmma`` on an H100), none on a T4 (sm_75), where Triton emits no tensor-core code.
    Spills are printed (``-s``), not asserted."""
    results = compile_subset(tmp_path)
    print(_aot.summary(results))
    kernels = {(r["family"], r["kernel"]) for r in results if r["gpu"] == "T4"}
    assert len(kernels) == 4 + 5 + 5 + 2, sorted(kernels)          # every kernel on a T4
    assert not [r for r in results if r["error"]], [r["error"] for r in results if r["error"]]
    assert _aot.problems(results) == []
    half = [r for r in results if r["dtype"] == "bf16"]
    assert {r["gpu"] for r in half} == {"A100", "H100"}
    assert all(r["mma"] or r["wgmma"] for r in half)
    assert all(r["mma"] for r in half if r["gpu"] == "A100")       # sm_80 has no wgmma
    t4_half = [r for r in results if r["gpu"] == "T4" and r["dtype"] == "fp16"]
    assert t4_half and not any(r["mma"] or r["wgmma"] for r in t4_half)


def test_problems_name_what_a_gpu_would_refuse():
    """The checks themselves, on made-up results: each violation is named."""
    ok = {"family": "chunk_gla", "kernel": "_out_kernel", "gpu": "A100", "dtype": "bf16",
          "size": 128, "constexprs": {}, "num_warps": 4, "num_stages": 2, "kept": True,
          "estimate": None, "error": None, "shared": 1024, "registers": 128, "threads": 128,
          "local": 0, "mma": True, "wgmma": False}
    assert _aot.problems([ok]) == []
    bad = [{**ok, "shared": 200_000}, {**ok, "kernel": "_state_kernel", "mma": False},
           {**ok, "kernel": "_grad_v_kernel", "registers": 255, "threads": 512},
           {**ok, "family": "flash_attention", "kernel": "_fwd_kernel", "estimate": 512},
           {**ok, "kernel": "_d_state_kernel", "error": "OutOfResources"}]
    found = _aot.problems(bad)
    for needle in ("shared memory 200000 > 166912", "no tensor-core instruction",
                   "registers 255 x 512", "estimate 512 < compiled 1024", "compile failed",
                   "no kept config fits"):
        assert any(needle in line for line in found), (needle, found)


def test_results_are_saved_as_they_come_and_resumed(tmp_path, monkeypatch):
    """`_aot.run` with ``out`` saves every result as it finishes (``complete`` false until
    the last); ``resume`` compiles only the launches with no saved result for the same
    launch, Triton and kernel source (a changed source is compiled again)."""
    todo = _aot.launches(largest=True)[:4]
    source = {x: "v1" for x in todo}
    compiled, stop = [], []

    def fake_compile(x):
        if stop and len(compiled) == stop[0]:
            raise KeyboardInterrupt
        compiled.append(x)
        return {"family": x.family, "kernel": x.kernel, "gpu": x.gpu, "dtype": x.dtype,
                "size": x.size, "constexprs": dict(x.constexprs), "num_warps": x.num_warps,
                "num_stages": x.num_stages, "kept": x.kept, "estimate": None, "error": None,
                "seconds": 1.0, "shared": 0, "registers": 32, "threads": 128, "local": 0,
                "mma": True, "wgmma": False}

    monkeypatch.setattr(_aot, "compile_one", fake_compile)
    monkeypatch.setattr(_aot, "kernel_source", source.__getitem__)
    out = tmp_path / "results.json"
    stop.append(2)
    with pytest.raises(KeyboardInterrupt):
        _aot.run(todo, out=str(out))
    saved = json.loads(out.read_text())
    assert (len(saved["results"]), saved["complete"], saved["planned"]) == (2, False, 4)
    stop.clear()
    source[todo[0]] = "v2"                                   # its kernel was edited
    results = _aot.run(todo, out=str(out), resume=True)
    assert compiled[2:] == [todo[0], todo[2], todo[3]]
    assert [r["kernel"] for r in results] == [x.kernel for x in todo]
    saved = json.loads(out.read_text())
    assert saved["complete"] and len(saved["results"]) == 4
    assert _aot.run(todo, out=str(out), resume=True) == results and len(compiled) == 5


def test_report_reads_the_largest_size_and_what_is_missing(monkeypatch):
    """`_aot.report` (what the chapters glue) describes the largest planned size only and
    says how many of its planned launches the saved results hold."""
    def result(gpu, size, shared, kept=True):
        return {"family": "chunk_gla", "kernel": "_out_kernel", "gpu": gpu, "dtype": "fp16",
                "size": size, "constexprs": {}, "num_warps": 4, "num_stages": 2,
                "kept": kept, "estimate": None, "error": None, "shared": shared,
                "registers": 128, "threads": 128, "local": 0, "mma": gpu != "T4",
                "wgmma": False}
    plan = [["chunk_gla", "_out_kernel", g, "fp16", n, True]
            for g in ("T4", "A100", "H100") for n in (64, 128)]
    results = [result("T4", 128, 70_000), result("A100", 128, 2048), result("T4", 64, 1024)]
    monkeypatch.setattr(_aot, "saved", lambda: {"triton": "x", "plan": plan,
                                                "results": results})
    values, table = _aot.report(["chunk_gla"])
    assert values["sizes"] == 128 and values["compiled"] == "2 of the 3"
    # the T4's launch over its limit, and so no kept config that fits: two problems
    assert values["t4_problems"] == 2 and values["problems"] == 2
    assert values["largest"] == "68.4 of a T4's 64 KiB and 2.0 of an A100's 163 KiB"
    assert (values["tc_gpus"], values["no_tc_gpus"], values["h100_kib"]) == ("A100", "T4", "n/a")
    assert "T4" in table and "H100" not in table
