"""The selective scan's reference chunk form (`_factored_chunk_reference`, the one chapter 9 shows)
against the step loop and against the tuned `_factored_chunk_scan` that ``mode="chunk"`` runs."""
import pytest
import torch

from xfam_lib.ssm import selective_scan
from xfam_lib.ssm.selective import _bc_layout, _chunk_plan, _factored_chunk_reference, _factored_chunk_scan
from xfam_lib.testing import assert_close

F64 = torch.float64


@pytest.mark.parametrize("layout", ["fixed", "shared", "grouped"])
@pytest.mark.parametrize("size", [1, 4, 7, 45, 64])
def test_reference_chunk_form_equals_the_step_loop_M9_9(layout, size, gen):
    """fp64, chunks of 1, dividing L or not, L itself and longer than L; B and C fixed (d, N),
    shared by the channels (b, N, L) or in two groups (b, 2, N, L); outputs and last state."""
    b, E, L, N = 2, 6, 45, 4
    u = torch.randn(b, E, L, dtype=F64, generator=gen)
    delta = torch.nn.functional.softplus(torch.randn(b, E, L, dtype=F64, generator=gen))
    A = -torch.exp(torch.randn(E, N, dtype=F64, generator=gen))
    shape = {"fixed": (E, N), "shared": (b, N, L), "grouped": (b, 2, N, L)}[layout]
    B, C = (torch.randn(*shape, dtype=F64, generator=gen) for _ in range(2))
    y_loop, x_loop = selective_scan(u, delta, A, B, C, return_last_state=True)
    B_l, C_l = _bc_layout(B, E), _bc_layout(C, E)
    y, x = _factored_chunk_reference(delta, delta * u, A, B_l, C_l, size)
    assert_close(y, y_loop, name="outputs")
    assert_close(x, x_loop, name="last state")
    y_tuned, x_tuned = _factored_chunk_scan(delta, delta * u, A, B_l, C_l, size)
    assert_close(y, y_tuned, name="tuned outputs")
    assert_close(x, x_tuned, name="tuned last state")


def test_reference_chunk_form_in_fp32_at_the_planned_chunk_M9_9(gen):
    """Mamba's decays (A = -(1..16), delta = softplus(x - 2)) in fp32 at the chunk `_chunk_plan`
    picks: every factor in range, the reference equals the step loop at fp32's tolerance."""
    b, E, L, N = 2, 8, 256, 16
    u = torch.randn(b, E, L, generator=gen)
    delta = torch.nn.functional.softplus(torch.randn(b, E, L, generator=gen) - 2)
    A = -torch.arange(1, N + 1, dtype=torch.float32).repeat(E, 1)
    B, C = (torch.randn(b, N, L, generator=gen) for _ in range(2))
    size, _ = _chunk_plan(delta, A, 64, count_steps=False)
    assert size is not None
    y_loop, x_loop = selective_scan(u, delta, A, B, C, return_last_state=True)
    y, x = _factored_chunk_reference(delta, delta * u, A, _bc_layout(B, E), _bc_layout(C, E), size)
    assert_close(y, y_loop, name="outputs")
    assert_close(x, x_loop, name="last state")
