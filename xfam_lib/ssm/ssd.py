"""Mamba-2's state space duality (chapter 9): the SSD scan, its matrix and attention forms,
the chunked algorithm that joins them, and the Mamba-2 block around it."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..utils import check_positive_int, check_tensor
from ._common import _check_sequence, _work_dtype
from .selective import segsum


# ----------------------------------------------------------------------------- Mamba-2 / SSD
def _check_ssd(fn: str, x, a, B, C):
    """``x (batch, L, H, P)``, ``a (batch, L, H)``, ``B, C (batch, L, G, N)`` with ``G`` dividing ``H``."""
    for name, t in (("x", x), ("a", a), ("B", B), ("C", C)):
        check_tensor(name, t, floating=True)
    if x.dim() != 4 or x.shape[1] == 0:
        raise ValueError(f"{fn}: x must be (batch, L, H, P) with L >= 1, got {tuple(x.shape)}")
    batch, length, heads, _ = x.shape
    if tuple(a.shape) != (batch, length, heads):
        raise ValueError(f"{fn}: a must be (batch, L, H) = {(batch, length, heads)} (x {tuple(x.shape)}), "
                         f"got {tuple(a.shape)}")
    for name, t in (("B", B), ("C", C)):
        if t.dim() != 4 or tuple(t.shape[:2]) != (batch, length) or t.shape[2] == 0 or heads % t.shape[2] \
                or t.shape[-1] != B.shape[-1]:
            raise ValueError(f"{fn}: {name} must be (batch, L, G, N) with (batch, L) = {(batch, length)}, G dividing "
                             f"H = {heads} and N shared by B and C; got B {tuple(B.shape)}, C {tuple(C.shape)}")
    work = _work_dtype(x.dtype, a.dtype, B.dtype, C.dtype)
    rep = heads // B.shape[2]
    return (x.to(work), a.to(work), B.to(work).repeat_interleave(rep, dim=2),
            C.to(work).repeat_interleave(heads // C.shape[2], dim=2))


def _ssd_initial_state(fn: str, h0, x: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """``h0 (batch, H, P, N)`` in the compute dtype, zeros if ``None``."""
    shape = (x.shape[0], x.shape[2], x.shape[-1], B.shape[-1])
    if h0 is None:
        return x.new_zeros(shape)
    check_tensor("initial_state", h0, floating=True)
    if tuple(h0.shape) != shape:
        raise ValueError(f"{fn}: initial_state must be (batch, H, P, N) = {shape}, got {tuple(h0.shape)}")
    return h0.to(x.dtype)


def ssd_scan(x: torch.Tensor, a: torch.Tensor, B: torch.Tensor, C: torch.Tensor, initial_state=None,
             return_final_state: bool = False):
    """Loop reference for the scalar-decay SSM of Mamba-2 (SSD), one step at a time.

    ``x (batch, L, H, P)``, log decays ``a (batch, L, H)`` (``a = delta * A <= 0``), ``B, C (batch, L,
    G, N)`` (``G`` groups shared by ``H / G`` heads each). Per head, with a ``(P, N)`` state:
    ``h_t = exp(a_t) h_{t-1} + x_t B_t^T``, ``y_t = h_t C_t``. Returns ``y (batch, L, H, P)`` in ``x``'s
    dtype, and the final state ``(batch, H, P, N)`` if asked. (Mamba-2's ``x`` here is ``delta * x``.)
    """
    out = x.dtype
    x, a, B, C = _check_ssd("ssd_scan", x, a, B, C)
    batch, length, heads, p = x.shape
    h = _ssd_initial_state("ssd_scan", initial_state, x, B)
    ys = []
    for t in range(length):
        h = torch.exp(a[:, t])[..., None, None] * h + x[:, t, :, :, None] * B[:, t, :, None, :]
        ys.append((h * C[:, t, :, None, :]).sum(-1))
    y = torch.stack(ys, dim=1).to(out)
    return (y, h) if return_final_state else y


def ssd_matrix(a: torch.Tensor, B: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """The semiseparable matrix ``M = (C B^T) ∘ L``, ``L[t, s] = exp(a_{s+1} + ... + a_t)`` for ``s <= t``.

    ``a (batch, L, H)``, ``B, C (batch, L, H, N)`` → ``M (batch, H, L, L)``, lower triangular: the SSD
    "attention" matrix (Dao & Gu 2024), so that ``y = M x``.
    """
    decay = torch.exp(segsum(a.transpose(1, 2)))                                # (b, H, L, L)
    return torch.einsum("bthn,bshn->bhts", C, B) * decay


def ssd_attention_form(x: torch.Tensor, a: torch.Tensor, B: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """SSD as masked attention: ``y = ((C B^T) ∘ L) x`` per head, the quadratic form (see `ssd_matrix`).

    Shapes as in `ssd_scan`; equal to it (with a zero initial state). Queries are ``C``, keys ``B``,
    values ``x``, and the causal mask carries the decays ``L``: linear attention with a scalar gate.
    """
    out = x.dtype
    x, a, B, C = _check_ssd("ssd_attention_form", x, a, B, C)
    return torch.einsum("bhts,bshp->bthp", ssd_matrix(a, B, C), x).to(out)


def ssd_chunked(x: torch.Tensor, a: torch.Tensor, B: torch.Tensor, C: torch.Tensor, chunk_size: int = 64,
                initial_state=None, return_final_state: bool = False):
    """The SSD chunked algorithm (Dao & Gu 2024, after ``ssd_minimal.py``); shapes as in `ssd_scan`.

    ``L`` is cut into chunks of ``chunk_size`` (a ragged tail is padded with ``a = 0``, ``x = B = C = 0``,
    which changes neither the outputs nor the final state). Four steps:

    1. inside each chunk, the attention form (`ssd_matrix` on the chunk);
    2. each chunk's own end state ``sum_s exp(a_{s+1} + ... + a_end) x_s B_s^T``;
    3. the states passed from chunk to chunk (scalar decays per chunk), as one masked product over
       the ``L / T + 1`` chunk states, as ``ssd_minimal.py`` does: quadratic in their number;
    4. each position reads the state that entered its chunk, decayed to it, through ``C_t``.

    Cost ``O(L T (N + P) + L N P + (L / T)^2 N P)`` for chunk length ``T`` (per head), instead of
    ``O(L^2)``: linear in ``L`` while ``L / T`` stays small against ``T (N + P) / (N P)``; equal to
    `ssd_scan`.
    """
    chunk_size = check_positive_int("chunk_size", chunk_size)
    out = x.dtype
    x, a, B, C = _check_ssd("ssd_chunked", x, a, B, C)
    init = _ssd_initial_state("ssd_chunked", initial_state, x, B)[:, None]   # (b, 1, H, P, N)
    batch, length, heads, p = x.shape
    pad = (-length) % chunk_size
    x, B, C = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (x, B, C))
    a = F.pad(a, (0, 0, 0, pad))
    n_chunks = (length + pad) // chunk_size
    x, a, B, C = (t.reshape(batch, n_chunks, chunk_size, *t.shape[2:]) for t in (x, a, B, C))
    a = a.permute(0, 3, 1, 2)                                                    # (b, H, c, T)

    y_diag = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", C, B, torch.exp(segsum(a)), x)        # step 1
    to_end = F.pad(a.flip(-1).cumsum(-1)[..., :-1], (1, 0)).flip(-1)           # a_{s+1} + ... + a_{T-1}
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", B, torch.exp(to_end), x)                    # step 2
    states = torch.cat([init, states], dim=1)                                    # (b, c+1, H, P, N)
    chunk_decay = torch.exp(segsum(F.pad(a.sum(-1), (1, 0))))                  # (b, H, c+1, c+1)
    states = torch.einsum("bhzc,bchpn->bzhpn", chunk_decay, states)                              # step 3
    y_off = torch.einsum("bclhn,bchpn,bhcl->bclhp", C, states[:, :-1], torch.exp(a.cumsum(-1)))  # step 4
    y = (y_diag + y_off).reshape(batch, n_chunks * chunk_size, heads, p)[:, :length].to(out)
    return (y, states[:, -1]) if return_final_state else y


# ----------------------------------------------------------------------------- Mamba-2 block
class _GatedGroupRMSNorm(torch.nn.Module):
    """``norm(y * silu(z))``: RMSNorm over each of ``groups`` equal slices of the last dim, then a weight."""

    def __init__(self, dim: int, groups: int, eps: float):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim))
        self.groups, self.eps = groups, eps

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        out = y.dtype
        g = (y.float() * F.silu(z.float())).unflatten(-1, (self.groups, -1))
        g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * g.flatten(-2).to(out)


class Mamba2Block(torch.nn.Module):
    """The Mamba-2 mixer (Dao & Gu 2024), with the parameter names of Hugging Face's ``Mamba2Mixer``.

    ``x (batch, L, d_model)`` → ``(batch, L, d_model)``, with ``E = expand * d_model = H * head_dim``
    inner channels in ``H`` heads and ``n_groups`` groups of ``B, C`` (``G`` dividing ``H``):

    1. ``in_proj``, one projection *in parallel*: ``x -> z (E), xBC (E + 2 G N), dt (H)``;
    2. ``conv1d``: a causal depthwise convolution of width ``d_conv`` over ``xBC`` together, then SiLU;
    3. split into ``x (batch, L, H, P)``, ``B, C (batch, L, G, N)``; ``delta = softplus(dt + dt_bias)``
       and a scalar ``A = -exp(A_log)`` per head;
    4. `ssd_chunked` on ``(delta x, delta A, B, C)``, plus the skip ``D x`` per head;
    5. ``norm``: RMSNorm of ``y * silu(z)`` per group of channels; ``out_proj``: ``E -> d_model``.

    Initialisation as the reference: ``A = -(1..H)``, ``D = 1``, ``dt_bias`` the inverse softplus of
    steps log-uniform in ``[dt_min, dt_max]``.
    """

    def __init__(self, d_model: int, d_state: int = 64, d_conv: int = 4, expand: int = 2, head_dim: int = 64,
                 n_groups: int = 1, chunk_size: int = 64, eps: float = 1e-5, dt_min: float = 1e-3,
                 dt_max: float = 1e-1, dt_init_floor: float = 1e-4, conv_bias: bool = True, bias: bool = False):
        super().__init__()
        for name, val in (("d_model", d_model), ("d_state", d_state), ("d_conv", d_conv), ("expand", expand),
                          ("head_dim", head_dim), ("n_groups", n_groups), ("chunk_size", chunk_size)):
            check_positive_int(name, val)
        e = expand * d_model
        if e % head_dim or (e // head_dim) % n_groups:
            raise ValueError(f"Mamba2Block: head_dim must divide expand * d_model = {e} and n_groups the number "
                             f"of heads; got head_dim {head_dim}, n_groups {n_groups}")
        self.d_model, self.d_state, self.d_inner, self.head_dim = d_model, d_state, e, head_dim
        self.heads, self.n_groups, self.chunk_size = e // head_dim, n_groups, chunk_size
        conv_dim = e + 2 * n_groups * d_state
        self.in_proj = torch.nn.Linear(d_model, e + conv_dim + self.heads, bias=bias)
        self.conv1d = torch.nn.Conv1d(conv_dim, conv_dim, d_conv, groups=conv_dim, padding=d_conv - 1,
                                      bias=conv_bias)
        self.dt_bias = torch.nn.Parameter(torch.empty(self.heads))
        self.A_log = torch.nn.Parameter(torch.log(torch.arange(1, self.heads + 1, dtype=torch.float32)))
        self.D = torch.nn.Parameter(torch.ones(self.heads))
        self.norm = _GatedGroupRMSNorm(e, n_groups, eps)
        self.out_proj = torch.nn.Linear(e, d_model, bias=bias)
        with torch.no_grad():
            dt = torch.exp(torch.rand(self.heads) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
            dt = dt.clamp(min=dt_init_floor)
            self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_sequence("Mamba2Block: x", x, self.d_model)
        b, length, _ = x.shape
        e, g, n = self.d_inner, self.n_groups, self.d_state
        z, xbc, dt = self.in_proj(x).split([e, e + 2 * g * n, self.heads], dim=-1)
        xbc = F.silu(self.conv1d(xbc.transpose(1, 2))[..., :length]).transpose(1, 2)  # causal: drop the tail
        u, B, C = xbc.split([e, g * n, g * n], dim=-1)
        u = u.reshape(b, length, self.heads, self.head_dim)
        B, C = B.reshape(b, length, g, n), C.reshape(b, length, g, n)
        delta = F.softplus(dt + self.dt_bias)                                        # (b, L, H)
        A = -torch.exp(self.A_log.to(_work_dtype(self.A_log.dtype)))
        y = ssd_chunked(u * delta[..., None], delta * A, B, C, chunk_size=self.chunk_size)
        y = (y + self.D[:, None] * u).reshape(b, length, e)
        return self.out_proj(self.norm(y, z))
