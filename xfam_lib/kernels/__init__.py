"""Triton kernels for the library's hot paths, with the arguments and results of the PyTorch
forms they implement.

Importing this package does not import Triton: each kernel imports it on first use, so a reader
without Triton never needs it. The kernels run compiled on a CUDA GPU, and on CPU tensors in
Triton's interpreter, which must be switched on with ``TRITON_INTERPRET=1`` in the environment
before anything imports Triton (Triton builds its own helpers at import). A call a kernel
cannot serve (a dtype, a head size, a device) raises ``ValueError`` naming it; no kernel falls
back to another path.
"""
from __future__ import annotations

import importlib
import math

import torch

from ..ssm.selective import _check_scan_inputs
from ..utils import check_qkv, check_tensor, resolve_scale

__all__ = ["chunk_gla", "chunk_simple_gla", "flash_attention", "selective_scan"]

KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 128
MAX_STATE = 256


def _import_kernels(module: str):
    """Import ``xfam_lib.kernels.<module>``, which imports Triton; say how to get it if absent."""
    try:
        return importlib.import_module(f"{__name__}.{module}")
    except ImportError as err:
        if err.name is None or not err.name.startswith("triton"):
            raise
        raise ImportError("xfam_lib.kernels needs Triton, which is not installed: on Linux, "
                          "pip install triton (the version your torch requires: 3.7.1 for torch "
                          "2.13's CUDA build; the kernels run on 3.6 to 3.9)") from err


def _check_device(name: str, device: torch.device, dtype: torch.dtype, interpreted: bool) -> None:
    """Raise ``ValueError`` unless the kernels can run on ``device``: a CUDA GPU Triton compiles
    for, or the CPU with the kernels built for Triton's interpreter."""
    if device.type == "cpu":
        if not interpreted:
            raise ValueError(f"{name} got CPU tensors, which Triton runs only in its interpreter: "
                             f"set the environment variable TRITON_INTERPRET=1 at the start of a "
                             f"new process (before anything imports triton), or move the tensors "
                             f"to a CUDA GPU")
        return
    if device.type != "cuda":
        raise ValueError(f"{name} runs on CUDA GPUs (or on the CPU under TRITON_INTERPRET=1), "
                         f"got tensors on {device}")
    if torch.version.hip is None:                               # NVIDIA
        capability = torch.cuda.get_device_capability(device)
        if capability < (7, 0):
            raise ValueError(f"{name} needs an NVIDIA GPU of compute capability 7.0 or newer for "
                             f"Triton, got {capability} on {device}")
        if dtype == torch.bfloat16 and capability < (8, 0):
            raise ValueError(f"{name} in bfloat16 needs compute capability 8.0 or newer, got "
                             f"{capability} on {device}; use float16")


def _check_served(name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Raise ``ValueError`` for a dtype, head size or device mix the kernels do not serve."""
    if q.dtype not in KERNEL_DTYPES:
        raise ValueError(f"{name} serves float16, bfloat16 and float32, got {q.dtype}")
    d_k, d_v = q.shape[-1], v.shape[-1]
    if not (1 <= d_k <= MAX_HEAD_DIM and 1 <= d_v <= MAX_HEAD_DIM):
        raise ValueError(f"{name} serves head sizes 1 to {MAX_HEAD_DIM}, got d_k={d_k} and "
                         f"d_v={d_v} (q {tuple(q.shape)}, v {tuple(v.shape)})")
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")


def _check_bool(name: str, value) -> None:
    """Raise ``TypeError`` unless ``value`` is a bool (a flag of another type is not truthy)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")


def _gates_and_initial_state(q: torch.Tensor, v: torch.Tensor, log_g: torch.Tensor,
                             initial_state: torch.Tensor | None) -> torch.Tensor:
    """Check the log gates' dtype and values and the initial state (shape-checked ``log_g``);
    return the initial state as a contiguous fp32 ``(B, d_k, d_v)`` stack (zeros if None)."""
    compute = {q.dtype, torch.float32}
    if log_g.dtype not in compute:
        raise TypeError(f"log_g must have dtype {q.dtype} or torch.float32, got {log_g.dtype}")
    if not bool((torch.isfinite(log_g) & (log_g <= 0)).all()):
        raise ValueError(f"log_g must be finite and <= 0 (log forget gates), got values in "
                         f"[{log_g.min().item():.4g}, {log_g.max().item():.4g}]")
    lead, d_k, d_v = q.shape[:-2], q.shape[-1], v.shape[-1]
    batch = math.prod(lead)
    if initial_state is None:
        return torch.zeros(batch, d_k, d_v, dtype=torch.float32, device=q.device)
    check_tensor("initial_state", initial_state, floating=True)
    if initial_state.shape != (*lead, d_k, d_v):
        raise ValueError(f"initial_state must have shape (..., d_k, d_v) = "
                         f"{(*lead, d_k, d_v)}, got {tuple(initial_state.shape)}")
    if initial_state.dtype not in compute:
        raise TypeError(f"initial_state must have dtype {q.dtype} or torch.float32, got "
                        f"{initial_state.dtype}")
    return initial_state.float().reshape(batch, d_k, d_v).contiguous()


def _chunked(name: str, module: str, function: str, q, k, v, log_g, scale, initial_state,
             return_final_state: bool):
    """Run a chunked gated-linear-attention kernel (``module.function``, an autograd Function of
    contiguous ``(B, L, d)`` stacks) on checked inputs with any leading dims."""
    _check_bool("return_final_state", return_final_state)
    _check_served(name, q, k, v)
    scale = resolve_scale(scale, q.shape[-1])
    h0 = _gates_and_initial_state(q, v, log_g, initial_state)
    lead, length, d_k, d_v = q.shape[:-2], q.shape[-2], q.shape[-1], v.shape[-1]
    batch = h0.shape[0]
    kernel_module = _import_kernels(module)
    _check_device(name, q.device, q.dtype, kernel_module.INTERPRETED)

    def stack(t):                       # (..., L[, d]) -> contiguous (B, L[, d])
        return t.reshape(batch, length, *t.shape[len(lead) + 1:]).contiguous()

    out, final = getattr(kernel_module, function).apply(stack(q), stack(k), stack(v), stack(log_g),
                                                        h0, scale)
    out = out.reshape(*lead, length, d_v)
    return (out, final.reshape(*lead, d_k, d_v)) if return_final_state else out


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                    scale: float | None = None) -> torch.Tensor:
    """FlashAttention-2 in Triton: ``softmax(q k^T * scale) v`` without storing the scores.

    The conventions of `xfam_lib.attention.scaled_dot_product_attention`: ``q (..., Lq, d_k)``,
    ``k (..., Lk, d_k)``, ``v (..., Lk, d_v)`` → ``(..., Lq, d_v)`` with any leading dims;
    ``causal`` is bottom-right aligned, and a query that sees no key (``Lq > Lk``) gets zeros
    and zero gradients; ``scale`` defaults to ``1/sqrt(d_k)``. fp16, bf16 and fp32 inputs,
    head sizes up to 128; products accumulate in fp32 and the result has the input dtype.
    Differentiable: the backward recomputes the weights from the saved log-sum-exp.
    """
    check_qkv(q, k, v)
    _check_bool("causal", causal)
    _check_served("flash_attention", q, k, v)
    scale = resolve_scale(scale, q.shape[-1])
    d_k, d_v = q.shape[-1], v.shape[-1]
    flash = _import_kernels("_flash")
    _check_device("flash_attention", q.device, q.dtype, flash.INTERPRETED)

    lead, len_q, len_k = q.shape[:-2], q.shape[-2], k.shape[-2]
    batch = math.prod(lead)                                     # the kernels see (B, L, d)
    out = flash.FlashAttention.apply(q.reshape(batch, len_q, d_k).contiguous(),
                                     k.reshape(batch, len_k, d_k).contiguous(),
                                     v.reshape(batch, len_k, d_v).contiguous(), causal, scale)
    return out.reshape(*lead, len_q, d_v)


def chunk_simple_gla(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_g: torch.Tensor, *,
                     scale: float | None = None, initial_state: torch.Tensor | None = None,
                     return_final_state: bool = False):
    """Scalar-gated linear attention, chunked, in Triton: one log gate per step and head,
    ``S_t = exp(log_g_t) S_{t-1} + k_t v_t^T`` and ``o_t = scale * S_t^T q_t``.

    ``q, k (..., L, d_k)``, ``v (..., L, d_v)``, ``log_g (..., L)`` (finite, ``<= 0``) →
    ``out (..., L, d_v)``, and ``(out, final_state (..., d_k, d_v))`` with
    ``return_final_state``: the results of `xfam_lib.linear.gated_linear_attention` with the
    gate broadcast over ``d_k``. ``scale=None`` means ``1/sqrt(d_k)``. fp16, bf16 and fp32,
    head sizes up to 128; products take their operands in the input dtype (tensor cores for
    fp16/bf16) and accumulate in fp32, gates and states stay fp32, ``out`` has the input
    dtype and the final state is fp32. Differentiable in ``q, k, v, log_g`` and
    ``initial_state``.
    """
    check_qkv(q, k, v, same_length=True)
    check_tensor("log_g", log_g, floating=True)
    if log_g.shape != q.shape[:-1]:
        raise ValueError(f"log_g must have shape (..., L) = {tuple(q.shape[:-1])} (one gate per "
                         f"step and head), got {tuple(log_g.shape)}")
    return _chunked("chunk_simple_gla", "_simple_gla", "ChunkSimpleGLA", q, k, v, log_g, scale,
                    initial_state, return_final_state)


def chunk_gla(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_g: torch.Tensor, *,
              scale: float | None = None, initial_state: torch.Tensor | None = None,
              return_final_state: bool = False):
    """Gated linear attention with one log gate per step and key dimension, chunked, in Triton:
    ``S_t = diag(exp(log_g_t)) S_{t-1} + k_t v_t^T`` and ``o_t = scale * S_t^T q_t``.

    ``q, k (..., L, d_k)``, ``v (..., L, d_v)``, ``log_g (..., L, d_k)`` (finite, ``<= 0``) →
    ``out (..., L, d_v)``, and ``(out, final_state (..., d_k, d_v))`` with
    ``return_final_state``: the arguments and results of
    `xfam_lib.linear.gated_linear_attention`. ``scale=None`` means ``1/sqrt(d_k)``. fp16, bf16
    and fp32, head sizes up to 128; products take their operands in the input dtype (tensor
    cores for fp16/bf16) and accumulate in fp32, gates and states stay fp32 (the cumulative
    gates fp64), ``out`` has the input dtype and the final state is fp32. Differentiable in
    ``q, k, v, log_g`` and ``initial_state``.
    """
    check_qkv(q, k, v, same_length=True)
    check_tensor("log_g", log_g, floating=True)
    if log_g.shape != k.shape:
        raise ValueError(f"log_g must have the shape of k (..., L, d_k) = {tuple(k.shape)}, got "
                         f"{tuple(log_g.shape)}")
    return _chunked("chunk_gla", "_gla", "ChunkGLA", q, k, v, log_g, scale, initial_state,
                    return_final_state)


def selective_scan(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                   C: torch.Tensor, D: torch.Tensor | None = None, z: torch.Tensor | None = None,
                   delta_bias: torch.Tensor | None = None, delta_softplus: bool = False,
                   return_last_state: bool = False):
    """Mamba's selective scan, fused in Triton: one program instance per batch element and
    block of channels, the states in registers, one pass over time, step after step.

    Sequential in time within each program instance (parallel across channels, states and
    instances), unlike Mamba's CUDA kernel, which also scans each chunk of the sequence in
    parallel across a thread block's threads.

    The arguments and results of `xfam_lib.ssm.selective_scan`: ``u, delta, z (batch, d_inner,
    L)``, real ``A (d_inner, N)``, ``B, C`` fixed ``(d_inner, N)``, input-dependent ``(batch, N,
    L)`` or grouped ``(batch, G, N, L)``, ``D, delta_bias (d_inner,)``; returns ``y`` in ``u``'s
    dtype, and ``(y, last_state (batch, d_inner, N))`` with ``return_last_state``. fp16, bf16
    and fp32 inputs, ``N`` up to 256; everything runs in fp32 and the last state is fp32.
    Differentiable in every tensor input: the backward walks the recurrence in reverse,
    recomputing the states chunk by chunk from checkpoints the forward saved.
    """
    _check_scan_inputs(u, delta, A, B, C, D, z, delta_bias)
    inputs = {"u": u, "delta": delta, "A": A, "B": B, "C": C, "D": D, "z": z,
              "delta_bias": delta_bias}
    for name, t in inputs.items():
        if t is not None and t.dtype not in KERNEL_DTYPES:
            raise ValueError(f"kernels.selective_scan serves float16, bfloat16 and float32, got "
                             f"{name} in {t.dtype}")
    _check_bool("delta_softplus", delta_softplus)
    _check_bool("return_last_state", return_last_state)
    if A.shape[1] > MAX_STATE:
        raise ValueError(f"kernels.selective_scan serves state sizes N up to {MAX_STATE}, got "
                         f"N={A.shape[1]} (A {tuple(A.shape)})")
    scan = _import_kernels("_selective_scan")
    bf16 = any(t is not None and t.dtype == torch.bfloat16 for t in inputs.values())
    _check_device("kernels.selective_scan", u.device, torch.bfloat16 if bf16 else u.dtype,
                  scan.INTERPRETED)

    def f32(t):
        return None if t is None else t.float().contiguous()

    y, last = scan.SelectiveScan.apply(
        u.contiguous(), delta.contiguous(), f32(A), B.contiguous(), C.contiguous(), f32(D),
        None if z is None else z.contiguous(), f32(delta_bias), delta_softplus)
    return (y, last) if return_last_state else y
