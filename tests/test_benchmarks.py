"""benchmarks/: the shared helpers' result folders and device choice, and bench_kernels.py's CPU dry run.

The dry run: every kernel of the library checked against the fp64
reference at tiny sizes in Triton's interpreter (fla-core's GLA forms by their PyTorch references,
called as the GPU run calls its kernels), every timed code path called once, nothing saved.

The script runs in a subprocess because Triton's interpreter must be switched on before Triton is
imported (the script does it on the CPU). About 6 s of CPU time, so marked slow.
"""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from xfam_lib import kernels
from xfam_lib.utils import machine_record

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ("flash_attention", "selective_scan", "chunk_simple_gla", "chunk_gla")
_spec = importlib.util.spec_from_file_location("bench_common", ROOT / "benchmarks" / "common.py")
common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(common)


def test_results_go_to_results_on_the_cpu_and_to_its_cuda_folder_on_a_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("XFAM_BENCH_RESULTS", str(tmp_path))
    assert common.results_dir("cpu") == tmp_path
    assert common.results_dir("cuda") == tmp_path / "cuda"
    monkeypatch.delenv("XFAM_BENCH_RESULTS")
    assert common.results_dir("cpu") == ROOT / "benchmarks" / "results"
    monkeypatch.setenv("XFAM_BENCH_RESULTS", str(tmp_path))
    check = {"what": "a ratio", "value": 1.2, "target": "<= 1.5", "ok": True}
    path = common.save("probe", {"checks": [check]}, device="cpu")
    saved = json.loads(path.read_text())
    assert path == tmp_path / "probe.json" and saved["checks"] == [check]
    # the record a chapter needs to tell whether a rerun here repeats the saved numbers bit for bit,
    # and what else slows a timing
    assert saved["machine"] == {**machine_record("cpu"), "cpus": os.cpu_count(),
                                "load_average": saved["machine"]["load_average"]}


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is here")
def test_asking_for_cuda_without_it_names_the_option():
    with pytest.raises(SystemExit, match=r"--device cuda: torch sees no CUDA device"):
        common.bench_device(argv=["--device", "cuda"])
    assert common.bench_device(argv=[]) == torch.device("cpu")


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="Triton is pinned and tested on Linux only")
def test_kernel_bench_dry_run_checks_every_kernel_and_saves_nothing(tmp_path):
    out = tmp_path / "dry.json"
    env = {**os.environ, "XFAM_BENCH_RESULTS": str(tmp_path / "results"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "benchmarks/bench_kernels.py", "--device", "cpu",
                           "--dry-run-out", str(out)], check=False, cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not (tmp_path / "results").exists()          # a dry run saves no result
    result = json.loads(out.read_text())
    assert result["dry_run"] and [r["kernel"] for r in result["rows"]] == list(KERNELS)
    for row in result["rows"]:
        assert "error" not in row, row["error"]
        present = hasattr(kernels, row["kernel"])
        assert ("kernel_missing" in row) != present
        checked = [w for w in row["correct"] if w.startswith("xfam_")]
        if present or row["kernel"] == "selective_scan":   # the scan's PyTorch modes always run
            assert checked and all(row["correct"][w] == "ok" for w in checked), row["correct"]
        if row["kernel"] in ("chunk_simple_gla", "chunk_gla") and importlib.util.find_spec("fla"):
            assert row["correct"]["fla output"] == "ok"      # fla's naive form, in fla's layout
        timed = [ms for parts in row["ms"].values() for ms in parts.values()]
        assert timed and all(isinstance(ms, float) and ms > 0 for ms in timed), row["ms"]
