"""The library's base: utils, testing, bench, plots and widgets."""
import matplotlib

matplotlib.use("Agg")  # tests only: no display here (never set for the book build)

import statistics
import time

import pytest
import torch

from xfam_lib import bench, plots, utils, widgets
from xfam_lib.attention import MultiHeadAttention
from xfam_lib.testing import (SPREAD_WIDENING, assert_close, assert_within_seed_spread, check_causal,
                              check_permutation_equivariance, seed_spread_bounds, tolerance_for)
from xfam_lib.utils import machine_record, same_machine


def test_pick_device_and_override(monkeypatch):
    monkeypatch.delenv("XFAM_DEVICE", raising=False)
    assert utils.pick_device().type == ("cuda" if torch.cuda.is_available() else "cpu")
    monkeypatch.setenv("XFAM_DEVICE", "cpu")
    assert utils.pick_device("cuda").type == "cpu"


def test_size_preset(monkeypatch):
    monkeypatch.delenv("XFAM_SIZE_SCALE", raising=False)
    cpu = utils.size_preset("cpu")
    assert (cpu.name, cpu.scale) == ("cpu", 1) and cpu.n(100) == 100
    assert utils.size_preset("cuda").scale > 1
    monkeypatch.setenv("XFAM_SIZE_SCALE", "3")
    assert utils.size_preset("cpu").n(100, multiple=64) == 256
    monkeypatch.setenv("XFAM_SIZE_SCALE", "0")
    with pytest.raises(ValueError, match="XFAM_SIZE_SCALE"):
        utils.size_preset("cpu")


def test_seed_everything_seeds_python_numpy_and_torch():
    """Each generator is seeded with the given seed: its next draws equal those of a fresh generator seeded so."""
    import random

    import numpy as np

    g = utils.seed_everything(3)
    assert random.random() == random.Random(3).random()
    assert np.random.rand() == np.random.RandomState(3).rand()
    assert torch.equal(torch.randn(4), torch.randn(4, generator=torch.Generator().manual_seed(3)))
    assert torch.equal(torch.randn(4, generator=g), torch.randn(4, generator=torch.Generator().manual_seed(3)))


def test_argument_checks_name_the_argument():
    with pytest.raises(TypeError, match="foo must be a torch.Tensor"):
        utils.check_tensor("foo", [1, 2])
    with pytest.raises(ValueError, match=r"bar must have 3 dims, got shape \(2, 2\)"):
        utils.check_tensor("bar", torch.zeros(2, 2), rank=3)
    with pytest.raises(TypeError, match="floating"):
        utils.check_tensor("x", torch.zeros(2, dtype=torch.long), floating=True)
    with pytest.raises(ValueError, match="n must be positive"):
        utils.check_positive_int("n", 0)
    with pytest.raises(TypeError):
        utils.check_positive_int("n", 2.0)
    with pytest.raises(TypeError, match="a=torch.float32, b=torch.float64"):
        utils.check_same_dtype(a=torch.zeros(1), b=torch.zeros(1, dtype=torch.float64))


def test_assert_close_passes_rounding_and_fails_real_errors():
    x = torch.randn(5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert_close(x, x + 1e-12)
    with pytest.raises(AssertionError, match="shape"):
        assert_close(x, x.T)
    with pytest.raises(AssertionError, match="1 of 20 elements differ"):
        assert_close(x + torch.where(x == x[2, 1], 1e-4, 0.0), x)
    # bf16 tolerance is looser than fp32 and is chosen from the less precise tensor
    assert tolerance_for(x.float(), x.bfloat16()) == tolerance_for(x.bfloat16())
    assert tolerance_for(x.bfloat16())[1] > tolerance_for(x.float())[1]
    assert tolerance_for(torch.arange(3)) == (0.0, 0.0)
    assert_close(x.bfloat16(), x)                         # one rounding to bf16 passes (relative error <= 2^-8)
    assert_close(x.half(), x)
    with pytest.raises(AssertionError, match="1 of 3 elements differ"):
        assert_close(torch.arange(3), torch.tensor([0, 1, 3]))     # integers are compared exactly


def test_assert_close_is_elementwise_one_wrong_element_in_bf16_fails():
    """A relative-RMS rule passes one badly wrong element among many good ones; the element-wise rule does not."""
    e = torch.randn(64, 64, generator=torch.Generator().manual_seed(1))
    a = e.bfloat16()
    assert_close(a, e)
    wrong = a.clone()
    wrong[17, 3] = e[17, 3] + 0.5                           # one element off by 0.5: rel. RMS error is only ~8e-3
    rel_rms = float((wrong.float() - e).norm() / e.norm())
    assert rel_rms < tolerance_for(wrong)[1]               # ... below bf16's rtol, so an RMS test would pass
    with pytest.raises(AssertionError, match=r"1 of 4096 elements differ.*index \(17, 3\).*relative RMS error"):
        assert_close(wrong, e)
    # the rule is |a - e| <= atol + rtol |e|: the same absolute error passes on a large element, fails on a small one
    big, small = torch.tensor([100.0]), torch.tensor([0.1])
    assert_close(big + 1.0, big, atol=1e-2, rtol=2e-2)
    with pytest.raises(AssertionError, match="allowed 1.2"):
        assert_close(small + 1.0, small, atol=1e-2, rtol=2e-2)
    with pytest.raises(ValueError, match="atol"):
        assert_close(e, e, atol=-1.0)


@pytest.mark.parametrize("got, expected, passes, words", [
    ([1.0, float("nan")], [1.0, 2.0], False, "NaN where expected is finite"),
    ([1.0, float("inf")], [1.0, 2.0], False, "inf where expected is finite"),
    ([1.0, 2.0], [1.0, float("nan")], False, "a number where expected is NaN"),
    ([1.0, float("-inf")], [1.0, float("inf")], False, "not the expected inf"),
    ([1.0, 5.0], [1.0, float("-inf")], False, "not the expected inf"),
    ([float("nan"), float("-inf"), 3.0], [float("nan"), float("-inf"), 3.0], True, None),
])
def test_assert_close_non_finite_values(got, expected, passes, words):
    for dtype in (torch.float64, torch.bfloat16):
        got_t, exp_t = torch.tensor(got, dtype=dtype), torch.tensor(expected, dtype=torch.float64)
        if passes:
            assert_close(got_t, exp_t)
        else:
            with pytest.raises(AssertionError, match=words):
                assert_close(got_t, exp_t)


def test_check_causal_and_permutation_helpers():
    x = torch.randn(1, 6, 3, dtype=torch.float64)
    assert check_causal(lambda t: t.cumsum(-2), x) == 0.0
    with pytest.raises(AssertionError):
        check_causal(lambda t: t.flip(-2).cumsum(-2), x)
    mha = MultiHeadAttention(3, 1).double()
    assert check_permutation_equivariance(mha, x) < 1e-12
    assert check_permutation_equivariance(lambda t: t.cumsum(-2), x) > 1e-3


def test_time_fn_and_peak_memory():
    assert bench.time_fn(lambda: torch.ones(10).sum(), repeats=3) > 0
    n = 1 << 20
    peak = bench.peak_memory(lambda: torch.ones(n, dtype=torch.float32) * 2)
    assert 2 * 4 * n <= peak <= 3 * 4 * n            # the ones tensor and the product are alive together
    freed = bench.peak_memory(lambda: [torch.ones(n).sum() for _ in range(4)])
    assert 4 * n <= freed < 2 * 4 * n                 # temporaries freed between iterations


class _FakeClock:
    """A ``perf_counter`` that only moves when a timed function says how long it took."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_time_ratios_interleaves_and_takes_medians(monkeypatch):
    clock, calls = _FakeClock(), []
    monkeypatch.setattr(bench.time, "perf_counter", clock)
    durations = {"a": iter([9.0, 1.0, 2.0, 3.0, 100.0]), "b": iter([5.0, 4.0, 6.0, 5.0, 0.5]),
                 "c": iter([1.0, 2.0, 1.0, 4.0, 3.0])}

    def timed(name):
        def run():
            calls.append(name)
            if len(calls) > 3:                      # the first round is the warm-up: not timed
                clock.now += next(durations[name])
        return run

    out = bench.time_ratios({n: timed(n) for n in "abc"}, repeats=4, warmup=1)
    assert "".join(calls) == "abc" + "abc" + "cba" + "abc" + "cba"
    # runs in order of timing: a 9, 1, 2, 3; b 5, 4, 6, 5; c 1, 2, 1, 4 (the fifth value is never used)
    assert out.median == {"a": 2.5, "b": 5.0, "c": 1.5}
    assert out.spread == {"a": 8 / 2.5, "b": 2 / 5.0, "c": 3 / 1.5}
    assert out.ratio("b", "a") == pytest.approx(statistics.median([5 / 9, 4 / 1, 6 / 2, 5 / 3]))
    assert out.ratio("a", "c") == pytest.approx(statistics.median([9 / 1, 1 / 2, 2 / 1, 3 / 4]))


def test_time_ratios_times_per_call_over_number_calls(monkeypatch):
    clock, calls = _FakeClock(), []
    monkeypatch.setattr(bench.time, "perf_counter", clock)

    def run(name, seconds):
        calls.append(name)
        clock.now += seconds

    out = bench.time_ratios({"a": lambda: run("a", 1.0), "b": lambda: run("b", 3.0)},
                            repeats=2, warmup=0, number=3)
    assert "".join(calls) == "aaabbb" + "bbbaaa"
    assert out.times == {"a": [1.0, 1.0], "b": [3.0, 3.0]} and out.ratio("b", "a") == 3.0


def test_time_ratios_with_real_sleeps():
    out = bench.time_ratios({"short": lambda: time.sleep(0.001), "long": lambda: time.sleep(0.05)},
                            repeats=3, warmup=0)
    assert [len(t) for t in out.times.values()] == [3, 3]
    assert 0.001 <= out.median["short"] < out.median["long"]
    assert out.ratio("long", "short") > 2           # sleep(0.05) never returns before 0.05 s


@pytest.mark.parametrize("kwargs, error, words", [
    ({"fns": {}}, TypeError, "fns"),
    ({"fns": [lambda: None]}, TypeError, "fns"),
    ({"fns": {"a": 3}}, TypeError, "fns"),
    ({"fns": {"a": lambda: None}, "repeats": 0}, ValueError, "repeats"),
    ({"fns": {"a": lambda: None}, "repeats": 2.5}, ValueError, "repeats"),
    ({"fns": {"a": lambda: None}, "warmup": -1}, ValueError, "warmup"),
    ({"fns": {"a": lambda: None}, "number": 0}, ValueError, "number"),
])
def test_time_ratios_rejects_bad_input(kwargs, error, words):
    with pytest.raises(error, match=words):
        bench.time_ratios(**kwargs)


def test_timings_ratio_names_the_unknown_candidate():
    out = bench.time_ratios({"a": lambda: None, "b": lambda: None}, repeats=1, warmup=0)
    with pytest.raises(ValueError, match="den.*'z'"):
        out.ratio("a", "z")


def test_plots_shape_table_and_heatmaps():
    mha = MultiHeadAttention(512, 8)
    rows = plots.shape_table(mha, torch.zeros(2, 10, 512))
    assert ("q_proj", "Linear", (2, 10, 512)) in rows
    fig = plots.attention_heatmap(torch.rand(4, 5), title="w")
    assert fig.axes[0].get_title() == "w"
    fig = plots.heatmaps({"a": torch.rand(3, 3), "b": torch.rand(3, 4), "c": torch.eye(2)}, ncols=2)
    assert len(fig.axes) == 4
    for n, grid in ((3, (1, 3)), (4, (2, 2)), (5, (2, 3)), (7, (3, 3))):   # rows wrap to fit MAX_WIDTH
        fig = plots.heatmaps({str(i): torch.rand(3, 3) for i in range(n)})
        assert fig.axes[0].get_subplotspec().get_gridspec().get_geometry() == grid
        assert fig.get_figwidth() <= plots.MAX_WIDTH
        matplotlib.pyplot.close(fig)
    fig = plots.heatmaps({str(i): torch.rand(3, 3) for i in range(4)}, ncols=4, size=3.0)
    assert fig.get_figwidth() <= plots.MAX_WIDTH and len(fig.axes) == 4
    fig = plots.loss_curves({"a": [3, 2, 1]}, reference={"chance": 2.5})
    assert fig.axes[0].get_lines()
    with pytest.raises(ValueError, match="2-D"):
        plots.attention_heatmap(torch.rand(2, 3, 4))


def test_interactive_figure_draws_default_then_redraws(monkeypatch):
    import ipywidgets
    import IPython.display
    import matplotlib.pyplot as plt

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda obj, **kw: shown.append(obj))

    calls = []

    def draw(scale=1.0, kind="a"):
        calls.append((scale, kind))
        fig, ax = plt.subplots()
        ax.plot([0, scale])
        return fig

    assert widgets.interactive_figure(draw, scale=(0.5, 2.0, 0.5), kind=["a", "b"]) is None
    assert calls == [(1.0, "a")]      # the slider starts mid-range, snapped to its step
    bundle = shown[-1]                # the controls, shown as a mime bundle with a static note for the HTML book
    assert "Interactive figure" in bundle["text/markdown"] and "`scale`, `kind`" in bundle["text/markdown"]
    from ipywidgets.widgets.widget import _instances
    box = _instances[bundle["application/vnd.jupyter.widget-view+json"]["model_id"]]
    assert isinstance(box, ipywidgets.VBox)
    box.children[1].value = "b"
    assert calls[-1][1] == "b" and len(calls) == 2


def test_assert_close_compares_complex_tensors_by_modulus():
    """A difference only in the imaginary part fails (it used to be cast away); complex64 gets fp32's
    tolerance on |a - e|, complex128 fp64's; rounding noise passes."""
    z = torch.complex(torch.randn(6, dtype=torch.float64), torch.randn(6, dtype=torch.float64))
    assert_close(z, z + 1e-12j)
    with pytest.raises(AssertionError, match="differ by more"):
        assert_close(z + 1e-3j, z)
    z32 = z.to(torch.complex64)
    assert_close(z32 * (1 + 1e-7), z32)
    with pytest.raises(AssertionError, match="atol=1.0e-05"):
        assert_close(z32 + 1e-3j, z32)
    with pytest.raises(AssertionError, match="NaN where expected is finite"):
        assert_close(z.where(torch.arange(6) != 2, complex("nan+0j")), z)


def test_assert_close_reports_no_relative_error_for_near_zero_expected_values():
    """Dividing by the norm of values within 10 atol of 0 gives a meaningless ratio (1e+300)."""
    with pytest.raises(AssertionError) as near_zero:
        assert_close(torch.ones(3, dtype=torch.float64), torch.full((3,), 1e-300, dtype=torch.float64))
    assert "relative RMS error" not in str(near_zero.value) and "near 0" in str(near_zero.value)
    with pytest.raises(AssertionError, match=r"relative RMS error 1\.000e\+00"):
        assert_close(torch.full((3,), 2.0, dtype=torch.float64), torch.ones(3, dtype=torch.float64))


def test_machine_record_names_the_kernel_set_and_threads_and_only_a_full_match_is_the_same_machine(monkeypatch):
    """Saved results record the machine; exact comparison only when every key matches."""
    here = machine_record("cpu")
    assert here["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert here["threads"] == torch.get_num_threads() and machine_record(threads=1)["threads"] == 1
    assert same_machine(here) and same_machine(dict(here))
    assert not same_machine(None) and not same_machine("AVX512")
    for key in ("torch", "cpu_capability", "threads", "cpu", "device"):
        other = {**here, key: "elsewhere"}
        assert not same_machine(other), key
        missing = {k: v for k, v in here.items() if k != key}       # an older record without the key
        assert not same_machine(missing), key
    assert same_machine({**here, "python": "3.0.0", "platform": "elsewhere"})   # not part of the match


@pytest.mark.parametrize("draw", [torch.randn, torch.rand], ids=["normal", "uniform"])
def test_a_fresh_seed_rarely_falls_outside_the_widened_range(draw):
    """What seed_spread_bounds promises, on 200,000 sets of 3 saved seeds and one fresh draw: the fresh
    draw leaves the plain range half the time (2 in 4: it is the smallest or the largest of four), and
    the widened range less than 1% of the time."""
    d = draw(200_000, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    lo, hi = d[:, :3].min(1).values, d[:, :3].max(1).values
    outside = lambda a, b: ((d[:, 3] < a) | (d[:, 3] > b)).double().mean().item()
    assert outside(lo, hi) == pytest.approx(0.5, abs=0.005)
    width = SPREAD_WIDENING * (hi - lo)
    assert outside(lo - width, hi + width) < 0.01


def test_a_rerun_elsewhere_is_checked_within_the_saved_seeds_range_widened():
    assert seed_spread_bounds([0.94, 0.99, 0.97]) == pytest.approx((0.64, 1.29))
    assert seed_spread_bounds([3, 3, 3], floor=2) == (-9, 15)
    assert_within_seed_spread("exact", 0.65, [0.94, 0.99, 0.97])
    with pytest.raises(AssertionError, match=r"exact: the live run gives 0.63, outside \[0.64, 1.29\]"):
        assert_within_seed_spread("exact", 0.63, [0.94, 0.99, 0.97])
    with pytest.raises(AssertionError, match="outside"):
        assert_within_seed_spread("count", 16, [3, 3, 3], floor=2)
    for bad in ([1.0], [1.0, float("nan")]):
        with pytest.raises(ValueError, match="saved must hold at least 2 numbers"):
            seed_spread_bounds(bad)
    with pytest.raises(ValueError, match="floor must be >= 0"):
        seed_spread_bounds([1, 2], floor=float("nan"))
