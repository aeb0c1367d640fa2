"""The device convention, enforced without a GPU: random draws use a CPU generator, then move.

A CPU ``torch.Generator`` cannot draw on CUDA: ``torch.randn(..., generator=g, device="cuda")``
raises ``Expected a 'cuda' device type for generator but found 'cpu'`` — on a GPU only, so a CPU
CI never sees it (it broke chapters 9 and 10 there). The convention (DESIGN.md, Devices) is to
draw on the CPU with the generator and then call ``.to(device)``; a draw that names both a
generator and a device is the bug class, wherever it appears: the library, the experiment and
benchmark scripts, the exercises, and every code cell of every notebook.
"""
import ast
import json
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
# torch's random factories and in-place samplers that accept ``generator=``
RANDOM_CALLS = {"rand", "randn", "randint", "randperm", "normal", "bernoulli", "multinomial",
                "poisson", "rand_like", "randn_like", "randint_like", "normal_", "uniform_",
                "random_", "bernoulli_", "exponential_", "geometric_", "cauchy_", "log_normal_"}


def _sources():
    """(label, python source) for every module and every notebook code cell of the project."""
    for folder in ("xfam_lib", "experiments", "benchmarks", "exercises", "scripts", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield str(path.relative_to(ROOT)), path.read_text()
    for path in sorted([*ROOT.glob("chapters/*.ipynb"), *ROOT.glob("exercises/*/*.ipynb"),
                        *ROOT.glob("book/*.ipynb")]):
        cells = json.loads(path.read_text())["cells"]
        for i, cell in enumerate(cells):
            if cell["cell_type"] == "code":
                # IPython magics and shell escapes are not Python; blank them for the parser
                lines = ["" if line.lstrip().startswith(("%", "!")) else line
                         for line in "".join(cell["source"]).splitlines()]
                yield f"{path.relative_to(ROOT)} cell {i}", "\n".join(lines)


def draws_with_generator_on_device(source: str) -> list[int]:
    """Line numbers of random draws that pass both ``generator=`` and a non-CPU ``device=``."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "attr", getattr(node.func, "id", None))
        if name not in RANDOM_CALLS:
            continue
        kwargs = {kw.arg: kw.value for kw in node.keywords if kw.arg}
        generator, device = kwargs.get("generator"), kwargs.get("device")
        if generator is None or device is None:
            continue
        if isinstance(generator, ast.Constant) and generator.value is None:
            continue
        if isinstance(device, ast.Constant) and device.value == "cpu":
            continue
        bad.append(node.lineno)
    return bad


def test_the_guard_finds_the_bug_class():
    """The checker flags the exact lines that failed on CUDA, and passes their fixed form."""
    broken = ("u = torch.randn(1, 16, L, generator=gen, device=device)\n"
              "w = torch.randn(2, 16, d, generator=g, device=device)\n"
              "z = torch.empty(3, device=device).normal_(generator=g, device=device)\n")
    assert draws_with_generator_on_device(broken) == [1, 2, 3]
    fixed = ("u = torch.randn(1, 16, L, generator=gen).to(device)\n"
             "v = torch.randn(3, generator=g, device='cpu')\n"
             "w = torch.randn(2, 16, d, device=device)\n")
    assert draws_with_generator_on_device(fixed) == []


def test_random_draws_use_a_cpu_generator_then_move():
    offenders = [f"{label}: line {line}" for label, source in _sources() if "generator=" in source
                 for line in draws_with_generator_on_device(source)]
    assert not offenders, ("these draws pass generator= and device= together; a CPU generator "
                           "cannot draw on CUDA. Draw on the CPU, then .to(device):\n  "
                           + "\n  ".join(offenders))
