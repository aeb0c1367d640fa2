"""The library's error contract, over its public functions: every call either works or raises a
clear error naming the argument; a batch of 0 works in every mode; a NaN query gives NaN on every path.

Three tables drive the tests: functions with a batch dimension (each run at batch 2 and at batch 0,
in every mode it offers), bad calls (each must raise the given exception with the argument's name in
the message), and the attention paths that must agree on a NaN query.
"""
import pytest
import torch

from xfam_lib.attention import padding_mask, scaled_dot_product_attention, tiled_attention
from xfam_lib.linear import (gated_linear_attention, linear_attention, performer_attention, retention,
                             rfa_attention)
from xfam_lib.positional import shaw_relative_attention, xl_relative_scores
from xfam_lib.sparse import dca_attention, sliding_window_attention
from xfam_lib.ssm import MambaBlock, discretize, selective_scan, ssd_chunked, ssd_scan

from bad_input import check_bad_input   # tests/bad_input.py

GEN = torch.Generator().manual_seed(0)


def rand(*shape):
    return torch.randn(*shape, generator=GEN)


def attn(b):
    return rand(b, 2, 10, 8), rand(b, 2, 10, 8), rand(b, 2, 10, 8)


def scan(b):
    return rand(b, 4, 10), torch.rand(b, 4, 10, generator=GEN), -torch.rand(4, 3, generator=GEN), \
        rand(b, 3, 10), rand(b, 3, 10)


def ssd(b):
    return rand(b, 10, 2, 8), -torch.rand(b, 10, 2, generator=GEN), rand(b, 10, 1, 4), rand(b, 10, 1, 4)


_W = rand(16, 8)
BATCHED = {
    **{f"linear_attention {m} causal={c}": (lambda b, m=m, c=c: linear_attention(*attn(b), causal=c, mode=m,
                                                                                 chunk_size=4))
       for m in ("parallel", "recurrent", "chunk") for c in (False, True)},
    **{f"gated_linear_attention {m}": (lambda b, m=m: gated_linear_attention(
        *attn(b), -torch.rand(b, 2, 10, 8, generator=GEN), mode=m, chunk_size=4))
       for m in ("recurrent", "parallel", "chunk")},
    **{f"retention {m}": (lambda b, m=m: retention(*attn(b), 0.9, mode=m, chunk_size=4))
       for m in ("recurrent", "parallel", "chunk")},
    **{f"performer_attention {m}": (lambda b, m=m: performer_attention(*attn(b), 16, causal=True, mode=m,
                                                                       chunk_size=4))
       for m in ("parallel", "recurrent", "chunk")},
    **{f"rfa_attention {m}": (lambda b, m=m: rfa_attention(*attn(b), _W, causal=True, mode=m, chunk_size=4))
       for m in ("parallel", "recurrent", "chunk")},
    **{f"selective_scan {m}": (lambda b, m=m: selective_scan(*scan(b), mode=m, chunk_size=4))
       for m in ("sequential", "chunk", "scan")},
    "ssd_scan": lambda b: ssd_scan(*ssd(b)),
    "ssd_chunked": lambda b: ssd_chunked(*ssd(b), chunk_size=4),
    "MambaBlock (chunk)": lambda b: MambaBlock(8)(rand(b, 10, 8)),
    "scaled_dot_product_attention causal": lambda b: scaled_dot_product_attention(*attn(b), causal=True),
    "tiled_attention causal": lambda b: tiled_attention(*attn(b), causal=True, block_q=4, block_k=4),
    "sliding_window_attention": lambda b: sliding_window_attention(*attn(b), 3, causal=True, block_size=4),
    "padding_mask with max_len": lambda b: padding_mask(torch.arange(b), max_len=5),
}


@pytest.mark.parametrize("name", BATCHED)
def test_a_batch_of_zero_works_in_every_mode(name):
    """Batch 0 gives an empty result shaped like batch 2's, instead of failing in a reshape or a
    reduction over an empty tensor (the chunk paths used to)."""
    torch.manual_seed(0)
    full = BATCHED[name](2)
    empty = BATCHED[name](0)
    full, empty = (t[0] if isinstance(t, tuple) else t for t in (full, empty))
    assert empty.shape == (0,) + full.shape[1:], f"{name}: {tuple(empty.shape)} for {tuple(full.shape)}"


q4, k4, v4 = attn(1)
BAD = [
    ("xl_relative_scores, rank-1 q", lambda: xl_relative_scores(rand(8), rand(3, 8), rand(3, 8), rand(8), rand(8)),
     ValueError, "q must have at least 2 dims"),
    ("xl_relative_scores, u of other heads",
     lambda: xl_relative_scores(rand(2, 3, 8), rand(2, 3, 8), rand(2, 3, 8), rand(5, 8), rand(5, 8)),
     ValueError, "u's leading dims"),
    ("shaw, bias of the wrong shape",
     lambda: shaw_relative_attention(q4, k4, v4, rand(5, 8), rand(5, 8), 2, bias=rand(3, 3)),
     ValueError, "bias of shape (3, 3)"),
    ("shaw, integer bias",
     lambda: shaw_relative_attention(q4, k4, v4, rand(5, 8), rand(5, 8), 2,
                                     bias=torch.ones(10, 10, dtype=torch.long)),
     TypeError, "bias must be a floating-point"),
    ("padding_mask, empty lengths", lambda: padding_mask(torch.tensor([], dtype=torch.long)),
     ValueError, "lengths is empty"),
    ("padding_mask, boolean lengths", lambda: padding_mask(torch.tensor([True, False])),
     ValueError, "lengths must be a 1-D integer"),
    ("discretize, dense bilinear at the pole", lambda: discretize(2 * torch.eye(2), torch.ones(2), 1.0, "bilinear"),
     ValueError, "I - delta A / 2 invertible"),
    ("discretize, diagonal bilinear at the pole",
     lambda: discretize(torch.tensor([2.0, -1.0]), torch.ones(2), 1.0, "bilinear"),
     ValueError, "delta * A != 2"),
    ("scaled_dot_product_attention, scale='abc'",
     lambda: scaled_dot_product_attention(q4, k4, v4, scale="abc"), ValueError, "scale must be"),
    ("gated_linear_attention, scale='abc'", lambda: gated_linear_attention(q4, k4, v4, -torch.ones(1, 2, 10, 8),
                                                                     scale="abc"),
     ValueError, "scale must be"),
    ("dca_attention, odd head size", lambda: dca_attention(rand(1, 2, 16, 7), rand(1, 2, 16, 7),
                                                           rand(1, 2, 16, 7), 8, 4, 2),
     ValueError, "dca_attention rotates q and k"),
]


@pytest.mark.parametrize("name,call,error,words", BAD, ids=[b[0] for b in BAD])
def test_bad_input_raises_a_clear_error_naming_the_argument(name, call, error, words):
    check_bad_input(name, call, error, words)


NAN_PATHS = {
    "fused": lambda q, k, v: scaled_dot_product_attention(q, k, v),
    "fused, causal": lambda q, k, v: scaled_dot_product_attention(q, k, v, causal=True),
    "fused, masked": lambda q, k, v: scaled_dot_product_attention(q, k, v, torch.ones(10, 10, dtype=torch.bool)),
    "with weights": lambda q, k, v: scaled_dot_product_attention(q, k, v, return_weights=True)[0],
    "tiled": lambda q, k, v: tiled_attention(q, k, v, block_q=4, block_k=4),
    "tiled, causal": lambda q, k, v: tiled_attention(q, k, v, causal=True, block_q=4, block_k=4),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("path", NAN_PATHS)
def test_a_nan_query_gives_a_nan_row_on_every_path(path, dtype):
    """One NaN in query 3 makes output row 3 NaN (the formula's answer) and leaves every other row
    finite, on every path; PyTorch's fused CPU kernel alone returns 0 there."""
    q, k, v = (t.to(dtype) for t in attn(1))
    q[0, 1, 3, 5] = float("nan")
    out = NAN_PATHS[path](q, k, v)
    assert out[0, 1, 3].isnan().all(), f"{path}: row 3 is {out[0, 1, 3]}"
    rest = torch.cat([out[0, 0], out[0, 1, :3], out[0, 1, 4:]])
    assert rest.isfinite().all()
