"""Ahead-of-time compiles of the kernels' launches for named NVIDIA GPUs, with no GPU and no
driver: what a GPU would refuse (shared memory, registers) is known at compile time.

Every launch the four wrappers make, forward and backward, at the block sizes and launch options
they would use on each GPU (for `flash_attention`: every autotuning config its prune keeps, and
with ``full`` every config, so that the prune's estimate is checked against the compiled size),
is compiled with ``triton.compile(ASTSource(...), target=GPUTarget("cuda", cc, 32))`` and the
ptxas that Triton ships. Each compile reports its shared memory (``metadata.shared``), the
registers and local (spill) memory per thread (from the cubin, with Triton's ``cuobjdump``) and
whether its PTX holds tensor-core instructions (``mma.sync``, ``wgmma``). `problems` lists what
a GPU would refuse or what item the kernels promise and miss.

    python -m xfam_lib.kernels._aot [--full | --largest | --subset] [--jobs N] [--out FILE]
                                    [--resume]

Run it without ``TRITON_INTERPRET`` (the kernels must be built for compiling). Compiles go to
``TRITON_CACHE_DIR`` if set, else to a fresh temporary directory (a cold run). With ``--out``
the results are saved as each compile finishes (``"complete": false`` until the last), worst
cases first; ``--resume`` keeps the saved results made by the same Triton from the same kernel
source (`launch_key`) and compiles only the rest.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import torch

# name: (compute capability, shared memory one block may use in bytes: the CUDA programming
# guide's maximum per block with opt-in, what Triton's driver reads as "max_shared_mem").
GPUS = {"T4": (75, 65_536), "A100": (80, 166_912), "L4": (89, 101_376), "H100": (90, 232_448)}
REGISTERS_PER_SM = 65_536        # 32-bit registers one block may use on all four
TRITON_TYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32",
                torch.float64: "fp64"}
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
HEAD_SIZES = (16, 64, 128)       # d_k = d_v
STATE_SIZES = (16, 256)          # the scan's N
LENGTH = 4096                    # long enough that the flash prune keeps every block size
# the families whose products promise tensor cores in half precision (on sm_80 and newer)
TENSOR_CORE_FAMILIES = ("flash_attention", "chunk_simple_gla", "chunk_gla")


@dataclasses.dataclass(frozen=True)
class Launch:
    """One compile: ``kernel`` (its module and name) for ``gpu``, inputs of ``dtype`` at size
    ``size`` (head size, or the scan's N), with ``constexprs`` and launch options; ``kept``:
    whether the wrappers would launch it (the prune keeps it), ``estimate``: the prune's
    shared-memory estimate (flash only)."""
    family: str
    module: str
    kernel: str
    gpu: str
    dtype: str
    size: int
    constexprs: tuple
    num_warps: int
    num_stages: int
    fp32: tuple = ()                 # pointer arguments in fp32 (others: the input dtype)
    fp64: tuple = ()
    kept: bool = True
    estimate: int | None = None


def _module(name: str):
    from importlib import import_module
    return import_module(f"xfam_lib.kernels.{name}")


def _pow2(d: int) -> int:
    return max(16, 1 << (d - 1).bit_length())


def flash_launches(gpu: str, dtype: torch.dtype, d: int, full: bool):
    flash = _module("_flash")
    cc, limit = GPUS[gpu]
    block = _pow2(d)
    meta = (("CAUSAL", True), ("BLOCK_DK", block), ("BLOCK_DV", block))
    elem = torch.empty(0, dtype=dtype).element_size()
    kernels = [("_fwd_kernel", flash.QUERY_CONFIGS, "BLOCK_M", "BLOCK_N", ("LSE",)),
               ("_bwd_dq_kernel", flash.QUERY_CONFIGS, "BLOCK_M", "BLOCK_N", ("LSE", "DELTA")),
               ("_bwd_dkdv_kernel", flash.KEY_CONFIGS, "BLOCK_N", "BLOCK_M", ("LSE", "DELTA"))]
    for name, configs, held, streamed, fp32 in kernels:
        kept = flash._fitting(configs, held, streamed, LENGTH, LENGTH, block, block, elem, cc,
                              limit)
        for c in configs if full else kept:
            yield Launch("flash_attention", "_flash", name, gpu, TRITON_TYPES[dtype], d,
                         (*meta, *sorted(c.kwargs.items())), c.num_warps, c.num_stages, fp32,
                         kept=c in kept,
                         estimate=flash._shared_memory(c.kwargs[held], c.kwargs[streamed],
                                                       c.num_stages, block, block, elem, cc))
    for c in flash.DELTA_CONFIGS:
        yield Launch("flash_attention", "_flash", "_bwd_delta_kernel", gpu, TRITON_TYPES[dtype],
                     d, (("BLOCK_M", c.kwargs["BLOCK_M"]), ("BLOCK_DV", block)), c.num_warps,
                     c.num_stages, ("DELTA",))


CHUNKED_FP32 = {"_state_kernel": ("G", "H0", "H", "HT"), "_out_kernel": ("G", "H"),
                "_d_state_kernel": ("G", "DHT", "DH", "DH0"),
                "_grad_qk_kernel": ("G", "H", "DH", "DQ", "DK"),
                "_grad_v_kernel": ("G", "DH", "DV")}


def chunked_launches(family: str, gpu: str, dtype: torch.dtype, d: int):
    """The five kernels of `chunk_simple_gla` (``_simple_gla``) or `chunk_gla` (``_gla``)."""
    name = "_simple_gla" if family == "chunk_simple_gla" else "_gla"
    module = _module(name)
    settings = dict(module.launch_settings(d, d))
    options = {"num_warps": settings.pop("num_warps"), "num_stages": settings.pop("num_stages")}
    if name == "_gla":
        settings["BLOCK_S"] = module.BLOCK_S
    for kernel, fp32 in CHUNKED_FP32.items():
        arg_names = getattr(module, kernel).arg_names
        constexprs = tuple((k, v) for k, v in settings.items() if k in arg_names)
        fp64 = ("Bc",) if name == "_gla" else ()
        yield Launch(family, name, kernel, gpu, TRITON_TYPES[dtype], d, constexprs, **options,
                     fp32=fp32, fp64=fp64)


def scan_launches(gpu: str, dtype: torch.dtype, n: int):
    scan = _module("_selective_scan")
    flags = scan._flags(True, True, True, True, n)
    fwd = {k: v for k, v in flags.items() if k in scan._fwd_kernel.arg_names}
    bwd = {**flags, "B_VARIES": True, "C_VARIES": True, "B_ONE_ROW": True, "C_ONE_ROW": True}
    fp32 = ("A", "D", "BIAS", "LAST", "CKPT", "SCRATCH", "DLAST", "DU", "DDELTA", "DZ", "DA",
            "DB", "DC", "DD")
    for kernel, constexprs in (("_fwd_kernel", fwd), ("_bwd_kernel", bwd)):
        yield Launch("selective_scan", "_selective_scan", kernel, gpu, TRITON_TYPES[dtype], n,
                     tuple(constexprs.items()), 4, 3, fp32)


def launches(full: bool = False, subset: bool = False, largest: bool = False) -> list[Launch]:
    """The launches to compile: every GPU, dtype and size the wrappers serve, at the configs
    they would launch (``full``: every flash config, kept or not); ``largest``: head size 128
    and state size 256 only, in fp32 and one half dtype (bf16, or fp16 where bf16 is not
    served); ``subset``: the cheap subset `in_subset`. Worst cases first, so that a stopped
    run has covered the most: the largest size, then the rest; the configs the wrappers
    launch before those they drop; every kernel, GPU and dtype once (flash: the kept config
    with the largest estimate) before its other configs; the GPU with the least shared
    memory first; family by family (flash, the scan, simple GLA, GLA)."""
    out = []
    for gpu in GPUS:
        for dtype in DTYPES:
            if dtype == torch.bfloat16 and GPUS[gpu][0] < 80:
                continue                                   # the wrappers refuse bf16 there
            if largest and dtype == torch.float16 and GPUS[gpu][0] >= 80:
                continue
            for d in HEAD_SIZES[-1:] if largest else HEAD_SIZES:
                out += flash_launches(gpu, dtype, d, full)
                out += chunked_launches("chunk_simple_gla", gpu, dtype, d)
                out += chunked_launches("chunk_gla", gpu, dtype, d)
            for n in STATE_SIZES[-1:] if largest else STATE_SIZES:
                out += scan_launches(gpu, dtype, n)
    out = [x for x in out if in_subset(x)] if subset else out
    families = ("flash_attention", "selective_scan", "chunk_simple_gla", "chunk_gla")
    gpus = sorted(GPUS, key=lambda g: GPUS[g][1])
    first = {}                                   # the kept config with the largest estimate
    for x in out:
        group = (x.kernel, x.family, x.gpu, x.dtype, x.size)
        if x.kept and (group not in first or (x.estimate or 0) > (first[group].estimate or 0)):
            first[group] = x
    chosen = set(first.values())
    return sorted(out, key=lambda x: (not _largest(x), not x.kept, x not in chosen,
                                      gpus.index(x.gpu), families.index(x.family)))


def _largest(x: Launch) -> bool:
    return x.size == (STATE_SIZES[-1] if x.family == "selective_scan" else HEAD_SIZES[-1])


def in_subset(x: Launch) -> bool:
    """The cheap subset: on a T4 every kernel at its worst case (fp32, the largest size: the
    most shared memory and registers, as Triton stages fp16 operands as fp32 there too; the
    delta kernel of the flash backward in one config) and one fp16 product, to show it gets
    no tensor core; on an H100, the two heaviest kernels of each chunked family in bf16 at
    head size 128, and on an A100 the two cheapest (the state kernels): tensor cores on both
    generations (``wgmma`` or ``mma`` on sm_90, ``mma`` on sm_80)."""
    largest = _largest(x)
    if x.gpu == "T4":
        return ((largest and x.dtype == "fp32" and x.kept
                 and (x.kernel != "_bwd_delta_kernel" or dict(x.constexprs)["BLOCK_M"] == 64))
                or (x.dtype == "fp16" and x.size == 64 and x.kernel == "_out_kernel"
                    and x.family == "chunk_simple_gla"))
    chunked = largest and x.dtype == "bf16" and x.family in ("chunk_simple_gla", "chunk_gla")
    if x.gpu == "A100":
        return chunked and x.kernel in ("_state_kernel", "_d_state_kernel")
    return chunked and x.gpu == "H100" and x.kernel in ("_out_kernel", "_grad_qk_kernel")


def _signature(fn, x: Launch) -> tuple[dict, dict]:
    """Triton's signature and attributes (pointers aligned to 16 bytes, as torch's are)."""
    signature, attrs = {}, {}
    for i, param in enumerate(fn.params):
        name = param.name
        if param.is_constexpr:
            signature[name] = "constexpr"
        elif name[0].isupper():                                   # a pointer
            dtype = "fp32" if name in x.fp32 else "fp64" if name in x.fp64 else x.dtype
            signature[name] = "*" + dtype
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "fp32" if "scale" in name else "i32"
    return signature, attrs


def compile_one(x: Launch) -> dict:
    """Compile ``x``; its resources and tensor-core instructions, or its error."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(_module(x.module), x.kernel)
    signature, attrs = _signature(fn, x)
    result = {**dataclasses.asdict(x), "constexprs": dict(x.constexprs)}
    start = time.perf_counter()
    try:
        compiled = triton.compile(ASTSource(fn, signature, dict(x.constexprs), attrs),
                                  target=GPUTarget("cuda", GPUS[x.gpu][0], 32),
                                  options={"num_warps": x.num_warps, "num_stages": x.num_stages})
    except Exception as err:                                      # noqa: BLE001  (reported)
        return {**result, "error": f"{type(err).__name__}: {str(err)[:500]}",
                "seconds": round(time.perf_counter() - start, 2)}
    ptx = compiled.asm["ptx"]
    regs, local = _resources(compiled.asm["cubin"])
    return {**result, "error": None, "seconds": round(time.perf_counter() - start, 2),
            "shared": compiled.metadata.shared, "registers": regs, "local": local,
            "threads": 32 * x.num_warps,
            "mma": bool(re.search(r"\bmma\.sync\.", ptx)), "wgmma": "wgmma.mma_async" in ptx}


def _resources(cubin: bytes) -> tuple[int, int]:
    """Registers and local memory (bytes, spills and stack) per thread, from ``cuobjdump``."""
    from triton.backends.nvidia import compiler

    tool = os.path.join(os.path.dirname(compiler.__file__), "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True,
                               text=True, check=True).stdout
    match = re.search(r"REG:(\d+).*?LOCAL:(\d+)", usage)
    return int(match[1]), int(match[2])


def problems(results: list[dict]) -> list[str]:
    """What a GPU would refuse, or what the kernels promise and miss, one line each: a failed
    compile; a kept config over the GPU's shared memory; a (kernel, GPU, dtype, size) with no
    kept config that fits; more registers than a block may hold; a flash config whose
    compiled shared memory exceeds the prune's estimate; a half-precision product of the
    tensor-core families without tensor-core instructions on sm_80 or newer."""
    found, fits = [], {}
    for r in results:
        where = (f"{r['kernel']} ({r['family']}) on {r['gpu']}, {r['dtype']}, size {r['size']}, "
                 f"{r['constexprs']}, warps {r['num_warps']}, stages {r['num_stages']}")
        if r["error"]:
            found.append(f"compile failed: {where}: {r['error']}")
            continue
        limit = GPUS[r["gpu"]][1]
        key = (r["family"], r["kernel"], r["gpu"], r["dtype"], r["size"])
        fits[key] = fits.get(key, False) or (r["kept"] and r["shared"] <= limit)
        if r["kept"] and r["shared"] > limit:
            found.append(f"shared memory {r['shared']} > {limit}: {where}")
        if r["registers"] * r["threads"] > REGISTERS_PER_SM:
            found.append(f"registers {r['registers']} x {r['threads']} threads: {where}")
        if r["estimate"] is not None and r["shared"] > r["estimate"]:
            found.append(f"estimate {r['estimate']} < compiled {r['shared']}: {where}")
        if (r["family"] in TENSOR_CORE_FAMILIES and r["dtype"] != "fp32"
                and GPUS[r["gpu"]][0] >= 80 and r["kernel"] != "_bwd_delta_kernel"
                and not (r["mma"] or r["wgmma"])):
            found.append(f"no tensor-core instruction: {where}")
    found += [f"no kept config fits: {key}" for key, ok in fits.items() if not ok]
    return found


def kernel_source(x: Launch) -> str:
    """A hash of the source of ``x``'s kernel and of every jitted function it calls (Triton's
    ``cache_key``; compiled kernels only)."""
    return getattr(_module(x.module), x.kernel).cache_key


def launch_key(x: Launch) -> str:
    """What a compile result depends on, hashed: the launch, the Triton version and
    `kernel_source`."""
    launch = {**dataclasses.asdict(x), "constexprs": dict(x.constexprs)}
    text = json.dumps([launch, triton_version(), kernel_source(x)], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def run(todo: list[Launch], jobs: int = 1, out: str | None = None,
        resume: bool = False) -> list[dict]:
    """Compile ``todo`` (in ``jobs`` processes) and return their results in its order. With
    ``out``, every result is saved there as it comes (`save`); with ``resume``, the results
    already saved in ``out`` for the same `launch_key` are kept, not compiled again."""
    keys = [launch_key(x) for x in todo]
    done = {}
    if resume and out and os.path.exists(out):
        planned = set(keys)
        for r in json.loads(Path(out).read_text()).get("results", []):
            if r.get("key") in planned:
                done[r["key"]] = r

    def finished(key, result):
        done[key] = {**result, "key": key}
        if out:
            save(out, [done[k] for k in keys if k in done], todo)

    left = [(k, x) for k, x in zip(keys, todo) if k not in done]
    if jobs == 1:
        for k, x in left:
            finished(k, compile_one(x))
    else:
        with ProcessPoolExecutor(jobs) as pool:
            futures = {pool.submit(compile_one, x): k for k, x in left}
            for future in as_completed(futures):
                finished(futures[future], future.result())
    if out and not left:
        save(out, [done[k] for k in keys], todo)
    return [done[k] for k in keys]


def save(out: str, results: list[dict], todo: list[Launch]) -> None:
    """Write ``results`` of the compiles ``todo`` to ``out`` (whole, or not at all):
    ``complete`` says whether every one is there, ``plan`` lists them all (family, kernel,
    GPU, dtype, size, kept); ``seconds``, the sum of their compile times."""
    data = {"triton": triton_version(),
            "fp_fusion": os.environ.get("TRITON_DEFAULT_FP_FUSION"),
            "complete": len(results) == len(todo), "planned": len(todo),
            "plan": [[x.family, x.kernel, x.gpu, x.dtype, x.size, x.kept] for x in todo],
            "seconds": round(sum(r["seconds"] for r in results)), "results": results,
            "problems": problems(results)}
    tmp = f"{out}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, out)


def summary(results: list[dict]) -> str:
    """Per GPU: compiles, those launched, their largest shared memory, the flash configs the
    prune drops although they compile within the limit (its estimate too cautious: not a
    failure, a config never timed), spills; the largest spill."""
    lines = []
    for gpu, (cc, limit) in GPUS.items():
        mine = [r for r in results if r["gpu"] == gpu and not r["error"]]
        if not mine:
            continue
        kept = [r for r in mine if r["kept"]]
        dropped = [r for r in mine if not r["kept"]]
        spills = [r for r in mine if r["local"]]
        worst = max(spills, key=lambda r: r["local"], default=None)
        lines.append(
            f"{gpu} (sm_{cc}, {limit // 1024} KiB): {len(mine)} compiles, {len(kept)} launched, "
            f"largest shared {max((r['shared'] for r in kept), default=0) // 1024} KiB, "
            f"{sum(r['shared'] <= limit for r in dropped)} of {len(dropped)} dropped configs "
            f"within the limit, {len(spills)} with local memory"
            + (f" (largest {worst['local']} B/thread: {worst['kernel']} {worst['dtype']} "
               f"size {worst['size']})" if worst else ""))
    return "\n".join(lines)


SAVED = "benchmarks/results/kernel_compile.json"    # written by make kernel-compile
GPU_BENCH = "benchmarks/results/cuda/kernels.json"  # written by scripts/gpu/session.sh


def _find(relative: str) -> Path | None:
    """``relative`` under the current directory or the nearest parent that holds it."""
    for base in (Path.cwd(), *Path.cwd().parents):
        if (base / relative).exists():
            return base / relative
    return None


def saved() -> dict | None:
    """The saved compile results (`SAVED`), or ``None`` where the repository is not there."""
    path = _find(SAVED)
    return None if path is None else json.loads(path.read_text())


def gpu_table(results: list[dict], families) -> dict[str, dict]:
    """Per GPU, for the launches of ``families`` (names of the wrappers): ``launched``, the
    compiles the wrappers would launch; ``sizes``, their head (or state) sizes; ``shared``,
    the largest shared memory among them and ``limit`` the GPU's (bytes); ``tensor_cores``,
    whether any fp16/bf16 compile holds tensor-core instructions (``None``: none compiled);
    ``spills``, how many use local memory (spilled registers); ``problems``, how many
    `problems` they have."""
    table = {}
    for gpu, (_, limit) in GPUS.items():
        mine = [r for r in results if r["gpu"] == gpu and r["family"] in families and r["kept"]]
        if not mine:
            continue
        half = [r for r in mine if r["dtype"] != "fp32" and not r["error"]]
        table[gpu] = {"launched": len(mine), "sizes": sorted({r["size"] for r in mine}),
                      "shared": max(r["shared"] for r in mine if not r["error"]),
                      "limit": limit, "problems": len(problems(mine)),
                      "spills": sum(bool(r.get("local")) for r in mine),
                      "tensor_cores": any(r["mma"] or r["wgmma"] for r in half) if half else None}
    return table


def report(families) -> tuple[dict, str]:
    """What a chapter says of the compiled kernels of ``families`` at the largest size they
    serve, from the saved results: values to glue (``"n/a"`` where the results are not
    here) and a table to print. ``compiled``: how many of the planned launches at that size
    the results hold (``"all N"`` or ``"n of the N"``); ``largest``: the largest shared
    memory per GPU against the GPU's, in KiB; ``t4_problems``: `problems` on a T4."""
    data = saved()
    values = dict.fromkeys(("triton", "compiled", "launches", "problems", "spills", "sizes",
                            "largest", "tc_gpus", "no_tc_gpus", "t4_problems"), "n/a")
    for gpu in GPUS:
        values[f"{gpu.lower()}_kib"] = values[f"{gpu.lower()}_limit_kib"] = "n/a"
    values["gpu_runs"] = ("one, in " + GPU_BENCH) if _find(GPU_BENCH) else "none yet"
    if data is None:
        return values, f"{SAVED} is not here: clone the repository to see the compile results"
    mine = [r for r in data["results"] if r["family"] in families]
    plan = [p for p in data.get("plan", []) if p[0] in families and p[5]]
    if not mine:
        return values, f"{SAVED} holds no compile of {', '.join(families)} yet"
    size = max(p[4] for p in plan) if plan else max(r["size"] for r in mine)
    results = [r for r in mine if r["size"] == size]
    table = gpu_table(results, families)
    lines = []
    for gpu, row in table.items():
        values[f"{gpu.lower()}_kib"] = round(row["shared"] / 1024, 1)
        values[f"{gpu.lower()}_limit_kib"] = row["limit"] // 1024
        lines.append(f"{gpu:5} sm_{GPUS[gpu][0]}: {row['launched']:3} launches, largest shared "
                     f"memory {row['shared'] / 1024:5.1f} of {row['limit'] / 1024:.0f} KiB, "
                     f"tensor cores in fp16/bf16: {row['tensor_cores']}, "
                     f"spilling: {row['spills']}, problems: {row['problems']}")
    launched = sum(row["launched"] for row in table.values())
    planned = sum(p[4] == size for p in plan)
    values.update(
        triton=data["triton"], launches=launched,
        compiled=(f"all {planned}" if launched == planned else
                  f"{launched} of the {planned}" if plan else str(launched)),
        problems=sum(row["problems"] for row in table.values()),
        spills=sum(row["spills"] for row in table.values()), sizes=size,
        largest=_listed([f"{row['shared'] / 1024:.1f} of {_a(gpu)}'s {row['limit'] // 1024} "
                         "KiB" for gpu, row in table.items()]),
        tc_gpus=", ".join(g for g, row in table.items() if row["tensor_cores"]) or "none",
        no_tc_gpus=", ".join(g for g, row in table.items() if row["tensor_cores"] is False)
        or "none")
    if "T4" in table:
        values["t4_problems"] = table["T4"]["problems"]
    return values, "\n".join(lines)


def _listed(items: list[str]) -> str:
    """``"a, b and c"``."""
    return " and ".join([", ".join(items[:-1]), items[-1]] if len(items) > 2 else items)


def _a(gpu: str) -> str:
    """``gpu`` with its article: "an A100", "a T4"."""
    return ("an " if gpu[0] in "AEFHILMNORSX" else "a ") + gpu


def triton_version() -> str:
    import triton
    return triton.__version__


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="every flash config, kept or not")
    parser.add_argument("--largest", action="store_true",
                        help="head size 128, N = 256, fp32 and one half dtype only")
    parser.add_argument("--subset", action="store_true", help="the subset the tests compile")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--out", help="write the results as JSON here, as they finish")
    parser.add_argument("--resume", action="store_true",
                        help="keep the results saved in --out for the same launch and source")
    args = parser.parse_args(argv)
    if args.resume and not args.out:
        parser.error("--resume needs --out, the file to resume")
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        parser.error("unset TRITON_INTERPRET: the kernels must be built for compiling")
    os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="xfam-aot-"))
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")       # Triton 3.9's default, said
    start = time.perf_counter()
    results = run(launches(args.full, args.subset, args.largest), args.jobs, args.out,
                  args.resume)
    found = problems(results)
    print(summary(results))
    print(f"{len(results)} compiles in {time.perf_counter() - start:.0f} s; "
          f"{len(found)} problems")
    print("\n".join(found))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
