"""Every `xfam_lib.kernels` kernel against the library's PyTorch form and the field's kernel.

Each kernel is looked up by name, so the script runs with any library version (a name the version
lacks is reported as such). Correctness first: the kernel's output and the gradients of ``q, k, v``
(``u`` for the scan) for one random cotangent, against the library's PyTorch form run in fp64 on the
same rounded inputs, within `assert_close`'s tolerance for the dtype (the scan: the book's 1e-3
relative scan tolerance; the chunked GLA kernels, whose products take bf16 operands: that tolerance
relative to the sums of their terms' sizes, `assert_close_terms`); the field's kernel is held to the
same reference. Then median forward and
forward+backward times (`triton.testing.do_bench`; the inputs require gradients, as in training) and
the ratios against the targets, on an H100:

- ``flash_attention``: within 1.5x of PyTorch's flash SDPA backend forward at (2, 16, 4096, 64)
  bf16, causal and not, and within 2x forward+backward;
- ``chunk_simple_gla``: within 1.5x of fla-core's ``chunk_simple_gla``, forward and
  forward+backward, (2, 16, 4096, 64) bf16 (fla's layout is (B, T, H, D));
- ``chunk_gla``: within 2x of fla-core's ``chunk_gla``, same shape and dtype;
- ``selective_scan``: at least 30x faster than the step loop ``ssm.selective_scan(mode="sequential")``
  at (batch, d_inner, L) = (2, 2048, 1024), N = 16, fp32; and the library's ``mode="chunk"`` at least
  10x faster than the loop.

``python benchmarks/bench_kernels.py --device cuda`` writes ``results/cuda/kernels.json``. On the CPU
the kernels run only in Triton's interpreter, so ``--device cpu`` (the default) is a dry run: tiny
sizes, correctness, each timed function called once (to run the code path; the times mean nothing),
nothing saved unless ``--dry-run-out`` names a file. ``--dry-run`` on CUDA: the tiny sizes on the GPU.
Exit status 1 if a kernel of the library is not correct; a missed time target is reported, not failed.
"""
from __future__ import annotations

import argparse
import os

from common import add_device_arg, resolve_device

# fla-core's kernels autotune on their first call (the longest part on a GPU): the GLA pair goes last, so a
# time limit that stops the script (it saves after every kernel) leaves the others measured
KERNELS = ("flash_attention", "selective_scan", "chunk_simple_gla", "chunk_gla")
TARGETS = {"flash_attention": {"fwd": 1.5, "fwd_bwd": 2.0}, "chunk_simple_gla": {"fwd": 1.5, "fwd_bwd": 1.5},
           "chunk_gla": {"fwd": 2.0, "fwd_bwd": 2.0}, "selective_scan": {"kernel": 30.0, "chunk": 10.0}}
FULL = {"attention": (2, 16, 4096, 64), "gla": (2, 16, 4096, 64), "scan": (2, 2048, 1024, 16)}
TINY = {"attention": (1, 1, 48, 16), "gla": (1, 1, 48, 16), "scan": (1, 8, 40, 4)}
SCAN_RTOL = 1e-3


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_device_arg(parser)
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes (always so on the CPU)")
    parser.add_argument("--dry-run-out", default=None, help="a dry run's JSON file (default: none)")
    args = parser.parse_args(argv)
    args.dry_run = args.dry_run or args.device == "cpu"
    return args


ARGS = parse_args() if __name__ == "__main__" else None
if ARGS is not None and ARGS.device == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"        # before anything imports triton (see xfam_lib.kernels)

import importlib
import importlib.util
import json
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F
from common import cuda_ms, save
from torch.nn.attention import SDPBackend, sdpa_kernel

from xfam_lib import kernels
from xfam_lib.attention import scaled_dot_product_attention, tiled_attention
from xfam_lib.linear import gated_linear_attention
from xfam_lib.ssm import selective_scan
from xfam_lib.testing import assert_close, assert_close_terms


def fla_op(op: str, name: str, device: torch.device):
    """fla-core's kernel ``fla.ops.<op>.<name>``, or why there is none (a string). On the CPU, whose
    Triton interpreter fla does not run, fla's PyTorch reference of the same layout from
    ``fla/ops/<op>/naive.py``, loaded by path as tests/test_8_oracles.py does (importing ``fla.ops``
    takes seconds), so that a dry run checks the call."""
    try:
        if device.type == "cuda":
            return getattr(importlib.import_module(f"fla.ops.{op}"), name)
        spec = importlib.util.find_spec("fla")
        if spec is None:
            return "fla-core is not installed"
        path = Path(spec.submodule_search_locations[0]) / "ops" / op / "naive.py"
        naive = importlib.util.spec_from_file_location(f"fla_naive_{op}", path)
        module = importlib.util.module_from_spec(naive)
        naive.loader.exec_module(module)
        return getattr(module, {"chunk_gla": "naive_recurrent_gla"}.get(name, f"naive_{name}"))
    except Exception as err:  # noqa: BLE001  (ImportError, or fla failing at import)
        return f"fla-core not importable: {type(err).__name__}: {err}"[:300]


def draw(shapes: dict, gen: torch.Generator, dtype: torch.dtype) -> dict:
    """Standard normal fp64 tensors rounded once to ``dtype`` (held in fp64 for the reference)."""
    return {n: torch.randn(*s, generator=gen, dtype=torch.float64).to(dtype).double() for n, s in shapes.items()}


class Form:
    """One implementation: ``fn()`` on ``inputs``; ``back`` turns its output and gradients into the
    reference's layout; ``check``: compared with the reference (the library's PyTorch forms in their
    working dtype are timed only)."""

    def __init__(self, fn, inputs, cot, back=lambda z: z, check=True):
        self.fn, self.inputs, self.cot, self.back, self.check = fn, inputs, cot, back, check


class Bench:
    """One kernel's comparisons: its correctness messages, times and checks."""

    def __init__(self, kernel: str, device: torch.device):
        self.device = device
        self.row = {"kernel": kernel, "correct": {}, "ms": {}, "checks": []}

    def compare(self, what: str, got: torch.Tensor, want: torch.Tensor, sizes=None, **tol) -> None:
        """``got`` against ``want`` (`assert_close`; with ``sizes``, the sums of the terms' sizes,
        `assert_close_terms`); the verdict goes into the row."""
        try:
            if sizes is None:
                assert_close(got.detach().cpu(), want.detach().cpu(), name=what, **tol)
            else:
                assert_close_terms(got, want, sizes, name=what)
            self.row["correct"][what] = "ok"
        except AssertionError as err:
            self.row["correct"][what] = str(err)[:600]
        print(f"  {what}: {self.row['correct'][what][:200]}", flush=True)

    def run(self, forms: dict, ref, ref_grads, names, tag="", tol=None, sizes=None) -> None:
        """Check every form against ``ref`` (output, then each gradient in ``names``; ``sizes``: the
        output's and the gradients' sums of the terms' sizes, for products rounded to half precision),
        then time it."""
        tol = tol or (lambda want: {})
        sizes = sizes or [None] * (1 + len(ref_grads))
        for name, f in forms.items():
            if not f.check:
                continue
            out = f.fn()
            self.compare(f"{name} output{tag}", f.back(out), ref, sizes[0], **tol(ref))
            if out.requires_grad:
                for g_name, got, want, size in zip(names, torch.autograd.grad(out, f.inputs, f.cot), ref_grads,
                                                   sizes[1:]):
                    self.compare(f"{name} {g_name}{tag}", f.back(got), want, size, **tol(want))
        for name, f in forms.items():
            self.time(name + tag, f)

    def time(self, name: str, f: Form) -> None:
        """Milliseconds of the forward (``fwd``) and of the forward and the vector-Jacobian product
        (``fwd_bwd``, where the output has a gradient)."""
        runs = {"fwd": f.fn, "fwd_bwd": lambda: torch.autograd.grad(f.fn(), f.inputs, f.cot)}
        for part, run in runs.items():
            try:
                if self.device.type == "cuda":
                    ms = cuda_ms(run)
                else:                           # a dry run: one call runs the code path
                    start = time.perf_counter()
                    run()
                    ms = 1e3 * (time.perf_counter() - start)
            except Exception as err:  # noqa: BLE001  (e.g. a form without a backward)
                ms = f"{type(err).__name__}: {err}"[:300]
            self.row["ms"].setdefault(name, {})[part] = ms
            print(f"  {name} {part}: {ms if isinstance(ms, str) else f'{ms:.3f} ms'}", flush=True)

    def ratio(self, what: str, num: str, den: str, part: str, target: float, at_most: bool) -> None:
        """A check on ``ms[num][part] / ms[den][part]`` (at most ``target``, or at least)."""
        a, b = (self.row["ms"].get(n, {}).get(part) for n in (num, den))
        if not (isinstance(a, float) and isinstance(b, float)):
            return
        value = a / b
        self.row["checks"].append({"what": what, "value": value, "target": f"{'<=' if at_most else '>='} {target}",
                                   "ok": value <= target if at_most else value >= target})


def on(device, dtype, *tensors, grad=False):
    return [t.to(device, dtype).requires_grad_(grad) for t in tensors]


def bench_attention(b: Bench, kernel, shape) -> None:
    gen, dtype = torch.Generator().manual_seed(0), torch.bfloat16
    x = draw({n: shape for n in ("q", "k", "v", "cot")}, gen, dtype)
    b.row.update(shape=list(shape), dtype="bf16", field="torch SDPA, flash backend (sdpa_kernel)")
    ins = on(b.device, dtype, x["q"], x["k"], x["v"], grad=True)
    cot = x["cot"].to(b.device, dtype)
    for causal in (False, True):
        tag = f", causal={causal}"
        ref_in = on(b.device, torch.float64, x["q"], x["k"], x["v"], grad=True)
        ref = scaled_dot_product_attention(*ref_in, causal=causal)
        ref_grads = torch.autograd.grad(ref, ref_in, x["cot"].to(b.device))
        del ref_in

        def flash_sdpa(causal=causal):
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(*ins, is_causal=causal)

        forms = {"torch_sdpa_flash": Form(flash_sdpa, ins, cot),
                 "xfam_tiled_attention": Form(lambda causal=causal: tiled_attention(
                     *ins, causal=causal, block_q=128, block_k=128), ins, cot, check=False)}
        if kernel is not None:
            forms = {"xfam_flash_attention": Form(lambda causal=causal: kernel(*ins, causal=causal), ins, cot),
                     **forms}
        b.run(forms, ref, ref_grads, ("dq", "dk", "dv"), tag)
        del ref, ref_grads
        if kernel is not None:
            for part in ("fwd", "fwd_bwd"):
                b.ratio(f"flash_attention / flash SDPA, {part}{tag}, {tuple(shape)} bf16", "xfam_flash_attention"
                        + tag, "torch_sdpa_flash" + tag, part, TARGETS["flash_attention"][part], True)


def bench_gla(b: Bench, kernel, shape, scalar: bool) -> None:
    """``chunk_simple_gla`` (a gate per step and head) or ``chunk_gla`` (a gate per key dim)."""
    name = "chunk_simple_gla" if scalar else "chunk_gla"
    gen, dtype = torch.Generator().manual_seed(1), torch.bfloat16
    B, H, L, D = shape
    x = draw({n: shape for n in ("q", "k", "v", "cot")}, gen, dtype)
    gate_shape = (B, H, L) if scalar else (B, H, L, D)
    log_g = (-0.1 * torch.rand(*gate_shape, generator=gen, dtype=torch.float64)).float()   # typical forget rates
    b.row.update(shape=list(shape), dtype="bf16", log_gate="uniform in [-0.1, 0], fp32",
                 field=f"fla-core {name}, layout (B, T, H, D)")
    full_gate = (lambda g: g[..., None].expand(*g.shape, D)) if scalar else (lambda g: g)

    ref_in = on(b.device, torch.float64, x["q"], x["k"], x["v"], grad=True)
    ref = gated_linear_attention(*ref_in, full_gate(log_g.double().to(b.device)), mode="chunk")
    ref_grads = torch.autograd.grad(ref, ref_in, x["cot"].to(b.device))
    # the same sums over absolute values (every decay is positive): the sizes of their terms, which
    # set the error of products whose operands are rounded to bf16 (tensor cores; fla's too)
    abs_in = on(b.device, torch.float64, x["q"].abs(), x["k"].abs(), x["v"].abs(), grad=True)
    size = gated_linear_attention(*abs_in, full_gate(log_g.double().to(b.device)), mode="chunk")
    sizes = [size.detach(), *torch.autograd.grad(size, abs_in, x["cot"].abs().to(b.device))]
    del ref_in, abs_in
    ins = on(b.device, dtype, x["q"], x["k"], x["v"], grad=True)
    cot, g = x["cot"].to(b.device, dtype), log_g.to(b.device)
    g_lib = full_gate(g).to(dtype)
    forms = {"xfam_gla_chunk_pytorch": Form(lambda: gated_linear_attention(*ins, g_lib, mode="chunk"), ins, cot,
                                            check=False)}
    field = fla_op("simple_gla" if scalar else "gla", name, b.device)
    if isinstance(field, str):
        b.row["field_missing"] = field
    else:                                       # fla's layout (B, T, H, .), made before the timing
        t = lambda z: z.transpose(1, 2)
        fla_ins = [t(z).detach().contiguous().requires_grad_() for z in ins]
        fla_g = t(g).contiguous()
        forms["fla"] = Form(lambda: field(*fla_ins, fla_g)[0], fla_ins, t(cot).contiguous(), back=t)
        b.row["field_fn"] = f"{field.__module__}.{field.__name__}"
    if kernel is not None:
        forms = {f"xfam_{name}": Form(lambda: kernel(*ins, g), ins, cot), **forms}
    b.run(forms, ref, ref_grads, ("dq", "dk", "dv"), sizes=sizes)
    if kernel is not None:
        for part in ("fwd", "fwd_bwd"):
            b.ratio(f"{name} / fla {name}, {part}, {tuple(shape)} bf16", f"xfam_{name}", "fla", part,
                    TARGETS[name][part], True)


def bench_scan(b: Bench, kernel, shape) -> None:
    batch, d_inner, L, N = shape
    gen = torch.Generator().manual_seed(2)
    x = draw({"u": (batch, d_inner, L), "delta": (batch, d_inner, L), "A": (d_inner, N), "B": (batch, N, L),
              "C": (batch, N, L), "cot": (batch, d_inner, L)}, gen, torch.float32)
    x["A"] = -torch.exp(0.5 * x["A"])
    b.row.update(shape={"batch": batch, "d_inner": d_inner, "L": L, "N": N}, dtype="fp32", delta_softplus=True,
                 field="none here (mamba_ssm's CUDA kernel is not installed)")
    args = [x[n].to(b.device) for n in ("u", "delta", "A", "B", "C")]
    ref_u = args[0].clone().requires_grad_()
    ref = selective_scan(ref_u, *args[1:], delta_softplus=True)
    ref_grads = torch.autograd.grad(ref, ref_u, x["cot"].to(b.device))
    u = args[0].float().requires_grad_()
    rest = [t.float() for t in args[1:]]
    cot = x["cot"].to(b.device, torch.float32)
    forms = {"xfam_scan_sequential": Form(lambda: selective_scan(u, *rest, delta_softplus=True), [u], cot),
             "xfam_scan_chunk": Form(lambda: selective_scan(u, *rest, delta_softplus=True, mode="chunk"), [u], cot)}
    if kernel is not None:
        forms["xfam_kernel_selective_scan"] = Form(lambda: kernel(u, *rest, delta_softplus=True), [u], cot)
    # the book's scan tolerance: 1e-3 relative to the largest value (L accumulated fp32 steps)
    b.run(forms, ref, ref_grads, ("du",),
          tol=lambda want: {"atol": SCAN_RTOL * want.abs().max().item(), "rtol": SCAN_RTOL})
    b.ratio(f"selective_scan chunk mode speed-up over the loop, fwd, {tuple(shape)} fp32",
            "xfam_scan_sequential", "xfam_scan_chunk", "fwd", TARGETS["selective_scan"]["chunk"], False)
    if kernel is not None:
        b.ratio(f"kernels.selective_scan speed-up over the loop, fwd, {tuple(shape)} fp32",
                "xfam_scan_sequential", "xfam_kernel_selective_scan", "fwd", TARGETS["selective_scan"]["kernel"],
                False)


def main(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    sizes = TINY if args.dry_run else FULL
    rows, failed = [], []
    for name in KERNELS:
        kernel = getattr(kernels, name, None)
        b = Bench(name, device)
        print(f"=== {name}" + ("" if kernel else ": not in this library version"), flush=True)
        if kernel is None:
            b.row["kernel_missing"] = "not in this library version"
        start = time.perf_counter()
        try:
            if name == "flash_attention":
                bench_attention(b, kernel, sizes["attention"])
            elif name in ("chunk_simple_gla", "chunk_gla"):
                bench_gla(b, kernel, sizes["gla"], scalar=name == "chunk_simple_gla")
            else:
                bench_scan(b, kernel, sizes["scan"])
        except Exception as err:  # noqa: BLE001  (one broken case must not hide the others)
            b.row["error"] = traceback.format_exc()[-1500:]
            print(f"  error: {type(err).__name__}: {err}", flush=True)
            failed.append(name)
        b.row["wall_s"] = round(time.perf_counter() - start, 1)
        wrong = [w for w, m in b.row["correct"].items() if m != "ok" and w.startswith("xfam")]
        if wrong:
            failed.append(name)
        rows.append(b.row)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if not args.dry_run and name != KERNELS[-1]:      # a time limit keeps the kernels done
            save("kernels", {"device": str(device), "complete": False, "rows": rows}, device=device)
    result = {"device": str(device), "dry_run": args.dry_run, "complete": True, "sizes": sizes, "targets": TARGETS,
              "rows": rows, "checks": [c for r in rows for c in r["checks"]]}
    if not args.dry_run:
        save("kernels", result, device=device)
    else:
        if args.dry_run_out:
            with open(args.dry_run_out, "w") as f:
                json.dump(result, f, indent=1, default=str)
        print("dry run: correctness at tiny sizes; times are one call each and mean nothing; "
              + (f"wrote {args.dry_run_out}" if args.dry_run_out else "nothing saved"))
    print(f"kernels not correct or failing: {sorted(set(failed))}" if failed else "every kernel present is correct")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(ARGS))
