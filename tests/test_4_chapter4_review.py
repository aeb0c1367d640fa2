"""Chapter 4 review: the readable half-split RoPE reference against the fast path in both layouts, Meta's and
Hugging Face's layouts through the weight permutation, what RoFormer's decay does and does not say (M4.9, M4.10),
and ALiBi in the 0-based convention (M4.12)."""
import json
from pathlib import Path

import pytest
import torch

from xfam_lib.positional import (alibi_bias, alibi_slopes, apply_rope, apply_rope_reference, rope_frequencies,
                                 rope_permutation, to_half_split, to_interleaved)
from xfam_lib.testing import assert_close

RESULTS = Path(__file__).resolve().parents[1] / "experiments" / "results" / "length_extrapolation.json"


# ----------------------------------------------------------------------------- the rotate_half reference (M4.9)
@pytest.mark.parametrize("base", [10000.0, 500000.0])
@pytest.mark.parametrize("shape", [(7, 8), (2, 3, 11, 32)])
def test_reference_equals_apply_rope_half_split_with_gradients_M4_9(shape, base, gen):
    x = torch.randn(*shape, dtype=torch.float64, generator=gen, requires_grad=True)
    positions = torch.randint(0, 5000, (shape[-2],), generator=gen)
    for pos in (None, positions):
        fast, ref = apply_rope(x, pos, base=base), apply_rope_reference(x, pos, base=base)
        assert_close(fast, ref)
        upstream = torch.randn(shape, dtype=torch.float64, generator=gen)
        (g_fast,), (g_ref,) = (torch.autograd.grad(y, x, upstream) for y in (fast, ref))
        assert_close(g_fast, g_ref)                     # the custom backward of apply_rope = autograd of the formula


def test_reference_gives_the_interleaved_layout_after_reordering_M4_9(gen):
    x = torch.randn(3, 9, 16, dtype=torch.float64, generator=gen)
    positions = torch.tensor([4, 0, 8, 1, 700, 2, 3, 5, 6])
    assert_close(apply_rope(x, positions, interleaved=True),
                 to_interleaved(apply_rope_reference(to_half_split(x), positions)))
    # and the reference is not layout-agnostic: on interleaved data it is a different map
    assert not torch.allclose(apply_rope(x, positions, interleaved=True), apply_rope_reference(x, positions))


def test_reference_fp32_matches_fast_path_to_fp32_rounding_M4_9(gen):
    x = torch.randn(4, 64, 32, generator=gen)
    # both use the same fp32 angle table; they differ only in the order of the fp32 multiply-adds
    assert_close(apply_rope(x), apply_rope_reference(x), atol=1e-6, rtol=1e-6)


def test_reference_bad_input_M4_9():
    with pytest.raises(ValueError, match="even"):
        apply_rope_reference(torch.randn(4, 5))
    with pytest.raises(TypeError, match="positions"):
        apply_rope_reference(torch.randn(4, 6), torch.ones(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="positions"):
        apply_rope_reference(torch.randn(4, 6), torch.arange(3))
    with pytest.raises((TypeError, ValueError), match="x"):
        apply_rope_reference(torch.arange(12).view(2, 6))


# ----------------------------------------------------------------------------- Meta vs Hugging Face layouts (M4.9)
def _conversion_permutation(w, n_heads):
    """Hugging Face's Llama conversion, written out: inside each head, rows (2i, 2i+1) go to (i, i + d_head/2)."""
    d_head = w.shape[0] // n_heads
    rows = [h * d_head + 2 * i + member for h in range(n_heads) for member in (0, 1) for i in range(d_head // 2)]
    return w[rows]


@pytest.mark.parametrize("n_heads, d_head", [(1, 8), (4, 16), (3, 32)])
def test_interleaved_with_original_weights_equals_half_split_with_permuted_weights_M4_9(n_heads, d_head, gen):
    d_model, length = n_heads * d_head, 10
    w_q, w_k = (torch.randn(d_model, d_model, dtype=torch.float64, generator=gen) for _ in range(2))
    x = torch.randn(length, d_model, dtype=torch.float64, generator=gen)

    def scores(wq, wk, interleaved):
        q = (x @ wq.T).view(length, n_heads, d_head).transpose(0, 1)
        k = (x @ wk.T).view(length, n_heads, d_head).transpose(0, 1)
        return apply_rope(q, interleaved=interleaved) @ apply_rope(k, interleaved=interleaved).transpose(-1, -2)

    meta = scores(w_q, w_k, interleaved=True)
    hf = scores(_conversion_permutation(w_q, n_heads), _conversion_permutation(w_k, n_heads), interleaved=False)
    assert_close(hf, meta)
    assert (scores(w_q, w_k, interleaved=False) - meta).abs().max() > 0.1 * meta.abs().mean()   # the mix-up
    per_head = torch.cat([rope_permutation(d_head) + h * d_head for h in range(n_heads)])
    assert torch.equal(_conversion_permutation(w_q, n_heads), w_q[per_head])


# ----------------------------------------------------------------------------- RoFormer's decay: a bound (M4.10)
def test_roformer_bound_holds_and_decays_but_random_scores_do_not_M4_10(gen):
    d, n = 64, 3000
    theta = rope_frequencies(d, dtype=torch.float64)
    q, k = (torch.randn(n, 1, d, dtype=torch.float64, generator=gen) for _ in range(2))
    z_q, z_k = (torch.view_as_complex(t[:, 0].reshape(n, d // 2, 2).contiguous()) for t in (q, k))
    h = z_q * z_k.conj()
    step = torch.cat((h[:, :-1] - h[:, 1:], h[:, -1:]), -1).abs().max(-1).values
    k0 = apply_rope(k, torch.tensor([0]), interleaved=True)
    sizes, factors = [], []
    for dist in (0, 1, 3, 10, 30, 100, 300, 1000):
        partial_sums = torch.exp(1j * dist * theta).cumsum(-1).abs().sum()
        s = (apply_rope(q, torch.tensor([dist]), interleaved=True) * k0).sum(-1)[:, 0]
        assert (s.abs() <= step * partial_sums + 1e-9).all()
        sizes.append(s.abs().mean().item())
        factors.append(partial_sums.item())
    assert factors[-1] < 0.3 * factors[0]                         # the bound decays...
    assert max(sizes) < 1.1 * min(sizes)                          # ...the typical score does not


# ----------------------------------------------------------------------------- ALiBi, 0-based (M4.12)
@pytest.mark.parametrize("n_heads, q_len, k_len", [(8, 6, 6), (6, 3, 10), (5, 1, 7)])
def test_alibi_bias_in_the_books_zero_based_convention_M4_12(n_heads, q_len, k_len):
    slopes = alibi_slopes(n_heads, dtype=torch.float64)
    if n_heads == 8:
        assert_close(slopes, torch.tensor([2.0 ** (-8 * (h + 1) / n_heads) for h in range(n_heads)], dtype=torch.float64))
    expected = torch.tensor([[[-slopes[h].item() * abs((i + k_len - q_len) - j) for j in range(k_len)]
                              for i in range(q_len)] for h in range(n_heads)], dtype=torch.float64)
    assert_close(alibi_bias(n_heads, q_len, k_len, dtype=torch.float64), expected)


# ----------------------------------------------------------------------------- the saved experiment (M4.15)
def test_saved_length_extrapolation_results_are_complete_M4_15():
    """Figure 4.11 reads these numbers; three seeds, each with every arm and length, and means that match them."""
    saved = json.loads(RESULTS.read_text())
    seeds, lengths = saved["config"]["seeds"], [str(L) for L in saved["lengths"]]
    assert len(seeds) >= 3 and len(set(seeds)) == len(seeds)
    assert sum(run["wall_time_s"] for run in saved["runs"]) == pytest.approx(saved["wall_time_s"], abs=0.2)
    for kind in saved["config"]["kinds"]:
        for L in lengths:
            values = saved["loss_per_seed"][kind][L]
            assert len(values) == len(seeds)
            assert saved["loss"][kind][L] == pytest.approx(sum(values) / len(values), rel=1e-12)
        assert len(saved["per_position"][kind]) == saved["lengths"][-1]


# ----------------------------------------------------------------------------- far retrieval (beside M4.15)
FAR = Path(__file__).resolve().parents[1] / "experiments" / "far_retrieval.py"


def _far_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("far_retrieval_script", FAR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("length, distance", [(10, 2), (10, 9), (64, 40)])
def test_passkey_batch_puts_the_only_trigger_at_the_distance_M4_15(length, distance):
    from xfam_lib.tasks import BOS

    inputs, answers = _far_module().passkey_batch(50, length, distance, 6, torch.Generator().manual_seed(0))
    where = length - 1 - distance
    assert inputs.shape == (50, length) and answers.shape == (50,)
    assert (inputs[:, where] == BOS).all() and (inputs[:, -1] == BOS).all()
    assert ((inputs == BOS).sum(1) == 2).all()                   # the stray trigger of induction_heads is gone
    assert torch.equal(answers, inputs[:, where + 1]) and (answers != BOS).all()


@pytest.mark.parametrize("distance", [1, 10])
def test_passkey_batch_refuses_a_distance_outside_the_sequence_M4_15(distance):
    with pytest.raises(ValueError, match=f"distance must be in 2 .. length-1 = 9, got {distance}"):
        _far_module().passkey_batch(2, 10, distance, 6, torch.Generator().manual_seed(0))


def test_saved_far_retrieval_results_are_complete_M4_15():
    """The far-retrieval figure reads these numbers: three seeds, every arm and distance, means that match."""
    saved = json.loads((RESULTS.parent / "far_retrieval.json").read_text())
    cfg = saved["config"]
    assert len(cfg["seeds"]) >= 3 and len(set(cfg["seeds"])) == len(cfg["seeds"])
    for kind in cfg["kinds"]:
        per_seed = saved["accuracy_per_seed"][kind]
        assert len(per_seed) == len(cfg["seeds"]) and all(len(a) == len(cfg["distances"]) for a in per_seed)
        assert saved["accuracy"][kind] == pytest.approx([sum(a) / len(a) for a in zip(*per_seed)], rel=1e-12)
        assert len(saved["train_accuracy"][kind]) == len(cfg["seeds"])
    assert all(len(v) == len(cfg["seeds"]) for v in saved["alibi_reach_per_seed"].values())
