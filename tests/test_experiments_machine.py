"""experiments/: every script records the machine it ran on as `xfam_lib.utils.machine_record` (through
``common.save_result`` or directly), and results are merged only on the machine that made them (or run
by run, each run with its own record, as arena_converged.py resumes).

The scripts are read, not run (their ``--quick`` runs take 15 s to 2 minutes each); the helpers are
called on tiny dictionaries. About 1 s in all on a busy machine, most of it importing
length_extrapolation.py's libraries.
"""
import ast
import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest
import torch

from xfam_lib.utils import MACHINE_KEYS, machine_record, same_machine

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
SCRIPTS = sorted(p for p in EXPERIMENTS.glob("*.py") if p.name != "common.py")


def _load(name: str):
    """``experiments/<name>.py`` as a module. Its ``import common`` must find experiments/common.py, not
    benchmarks/common.py, which other tests import under the same name."""
    held = sys.modules.pop("common", None)
    sys.path.insert(0, str(EXPERIMENTS))
    try:
        spec = importlib.util.spec_from_file_location(f"experiments_{name}", EXPERIMENTS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(EXPERIMENTS))
        sys.modules.pop("common", None)
        if held is not None:
            sys.modules["common"] = held
    return module


def _calls(node: ast.AST, name: str) -> bool:
    """Whether ``node`` is a call of a function named ``name``."""
    return isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == name


def _machine_rule_breaks(tree: ast.AST) -> list[str]:
    """Where a script builds a machine record of its own instead of calling `machine_record` (or using a
    name bound to its result)."""
    records = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign) and _calls(node.value, "machine_record")
               for t in node.targets if isinstance(t, ast.Name)}

    def is_record(value):
        return _calls(value, "machine_record") or isinstance(value, ast.Name) and value.id in records

    breaks = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            breaks += [f"line {v.lineno}: 'machine' is not machine_record(...)" for k, v in zip(node.keys, node.values)
                       if isinstance(k, ast.Constant) and k.value == "machine" and not is_record(v)]
        elif isinstance(node, ast.Assign) and not is_record(node.value):
            breaks += [f"line {node.lineno}: ['machine'] = something else than machine_record(...)"
                       for t in node.targets if isinstance(t, ast.Subscript)
                       and isinstance(t.slice, ast.Constant) and t.slice.value == "machine"]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            breaks += [f"line {node.lineno}: imports platform (machine_record records it)" for n in names
                       if n == "platform"]
        elif isinstance(node, ast.Attribute) and node.attr == "__version__":
            breaks.append(f"line {node.lineno}: reads a __version__ (machine_record records torch's)")
    return breaks


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_every_script_records_its_machine_with_machine_record(script):
    tree = ast.parse(script.read_text(), filename=str(script))
    assert _machine_rule_breaks(tree) == [], script.name
    assert any(_calls(node, "save_result") or _calls(node, "machine_record") for node in ast.walk(tree)), \
        f"{script.name} writes no machine record (common.save_result or machine_record)"


def test_the_rule_catches_a_hand_made_record():
    """The check above fails on the records the scripts used to write."""
    old = ('import platform\nresult = {"machine": {"torch": torch.__version__, "threads": 1}}\n'
           'result["machine"] = f"{platform.system()}"\n')
    assert len(_machine_rule_breaks(ast.parse(old))) == 4
    assert _machine_rule_breaks(ast.parse('result = {"machine": machine_record("cpu", threads=1)}')) == []


def test_save_result_writes_the_full_machine_record(tmp_path):
    common = _load("common")
    threads = torch.get_num_threads()
    common.save_result(tmp_path / "r.json", {"x": 1}, threads=threads, start=time.perf_counter())
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["x"] == 1 and saved["wall_time_s"] >= 0
    assert set(MACHINE_KEYS) <= set(saved["machine"]) and same_machine(saved["machine"])


def test_a_saved_record_from_elsewhere_or_before_machine_record_is_refused():
    common = _load("common")
    here = machine_record("cpu", threads=1)
    common.check_same_machine({**here, "python": "3.0", "platform": "elsewhere"}, here, action="merge")
    with pytest.raises(ValueError, match=r"cannot merge: .*threads: saved 2, here 1"):
        common.check_same_machine({**here, "threads": 2}, here, action="merge")
    before = {"torch": here["torch"], "threads": 1, "python": here["python"], "cpu": here["cpu"]}
    with pytest.raises(ValueError, match="cpu_capability: not in the saved record.*device: not in the saved record"):
        common.check_same_machine(before, here, action="merge")
    with pytest.raises(ValueError, match="torch: not in the saved record"):
        common.check_same_machine("Linux x86_64", here, action="append")


def test_length_extrapolation_merges_only_results_from_this_machine():
    merge = _load("length_extrapolation").merge
    here = machine_record("cpu", threads=1)

    def result(seeds, loss, machine):
        return {"config": {"steps": 2, "seeds": seeds}, "loss_per_seed": {"rope": {"64": [loss] * len(seeds)}},
                "oracle": {"64": 1.0}, "per_position": {"rope": [loss]}, "wall_time_s": 1.0,
                "runs": [{"seeds": seeds, "wall_time_s": 1.0}], "machine": machine}

    merged = merge(result([0], 2.0, here), result([1, 2], 3.0, here))
    assert merged["config"]["seeds"] == [0, 1, 2] and merged["loss"]["rope"]["64"] == pytest.approx(8.0 / 3)
    saved_before = {k: here[k] for k in ("torch", "threads", "python", "cpu")}    # the record saved until now
    with pytest.raises(ValueError, match="cannot merge: .*cpu_capability: not in the saved record"):
        merge(result([0], 2.0, saved_before), result([1], 3.0, here))
