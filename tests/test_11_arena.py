"""Chapter 11, the capstone arena (METHODS M11.2, M11.6, M11.7): one model per family, matched budgets,
decoding-state sizes, and data-parallel training with ``torchrun``.

Each family's model is checked for causality by perturbation; the decoding-state formula against the
states the library's own recurrent forms return; and the 2-process ``torchrun`` run against the
1-process run with the same global batch.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from xfam_lib.arena import (BASELINES, FAMILIES, TASKS, ArenaLM, check_equal_answer_counts, count_params,
                            decode_state_bytes, init_decode_state, mixer_step, train_arena, width_for_budget)
from xfam_lib.linear import gated_linear_attention
from xfam_lib.tasks import PAD, mqar

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("family", FAMILIES + BASELINES)
def test_arena_model_is_causal_M11_6(family):
    """Changing token t changes no logit before t, and changes the logit at t."""
    torch.manual_seed(0)
    model = ArenaLM(family, 12, 16, 2, d_state=8, window=3, n_features=16, max_len=20).double().eval()
    ids = torch.randint(2, 12, (2, 10), generator=torch.Generator().manual_seed(1))
    base = model(ids)
    ids2 = ids.clone()
    ids2[:, 6] = (ids2[:, 6] - 1) % 10 + 2
    moved = model(ids2)
    assert torch.allclose(moved[:, :6], base[:, :6], rtol=0, atol=1e-12)
    assert (moved[:, 6] - base[:, 6]).abs().max() > 1e-6


def test_decode_state_bytes_match_the_library_states_M11_6():
    """softmax: the KV cache grows with the context; sliding window stops growing at window + 1 keys;
    GLA's count equals the numel of `gated_linear_attention`'s final state, Mamba's the numel of
    `MambaBlock.init_state` (per layer, plus the token shift's one vector)."""
    torch.manual_seed(0)
    soft = ArenaLM("softmax", 10, 16, 2)
    assert decode_state_bytes(soft, 200) - decode_state_bytes(soft, 100) == 2 * 2 * 100 * 16 * 4
    win = ArenaLM("sliding_window", 10, 16, 2, window=7)
    assert decode_state_bytes(win, 8) == decode_state_bytes(win, 500) > decode_state_bytes(win, 7)
    gla = ArenaLM("gla", 10, 16, 2, n_heads=2)
    q = torch.randn(1, 2, 5, 8)
    _, state = gated_linear_attention(q, q, q, torch.zeros_like(q), return_final_state=True)
    assert decode_state_bytes(gla, 5) == (2 * state.numel() + 16) * 4
    mamba = ArenaLM("mamba", 10, 16, 2, d_state=8)
    block = mamba.mixers[0]
    numel = sum(t.numel() for t in block.init_state(1))
    assert decode_state_bytes(mamba, 99) == (2 * numel + 16) * 4


@pytest.mark.parametrize("family", FAMILIES + BASELINES)
def test_mixer_step_reproduces_the_full_sequence_M11_7(family):
    """Decoding token by token with `mixer_step` gives every position of the mixer's full-sequence output
    (chunked, FFT or scanned forms), and the state it carries has the size `decode_state_bytes` counts:
    fixed in the position for every family but softmax, whose KV cache holds every token."""
    torch.manual_seed(0)
    model = ArenaLM(family, 12, 16, 2, d_state=8, window=3, n_features=16, max_len=40, seed=3).double().eval()
    mixer, L = model.mixers[1], 37                          # L not a multiple of the chunk size (32)
    x = torch.randn(2, L, 16, dtype=torch.float64)
    with torch.no_grad():
        full = mixer(x)
        state = init_decode_state(mixer, 2, L, dtype=torch.float64)
        steps = []
        for t in range(L):
            y, state = mixer_step(mixer, x[:, t], state)
            steps.append(y)
    err = (torch.stack(steps, 1) - full).abs().max().item()
    assert err < 1e-10, err
    if family == "softmax":
        assert state[1] == L
        tensors = [state[0].k[:, :, :L], state[0].v[:, :, :L]]
    else:
        tensors = list(state) if isinstance(state, tuple) else [state]
    if family in ("sliding_window", "based"):               # the window's keys and values stop growing
        assert state[-1].shape[-2] == model.window + 1
    numel = sum(t.numel() * (2 if t.is_complex() else 1) for t in tensors)   # complex: two reals each
    per_sequence = numel // 2                               # batch 2
    assert decode_state_bytes(model, L) == (2 * per_sequence + 16) * 4   # 2 layers, plus the token shift's vector


def test_gru_baseline_is_outside_the_families_M11_5():
    """The GRU baseline is a `torch.nn.GRU` mixer with no learned positions, keeps one d-vector per layer, and is
    not one of the sweep's `FAMILIES` (whose models are unchanged by it)."""
    assert "gru" in BASELINES and "gru" not in FAMILIES
    model = ArenaLM("gru", 12, 16, 2)
    assert model.pos is None and all(isinstance(m.gru, torch.nn.GRU) and m.gru.hidden_size == 16 for m in model.mixers)
    assert decode_state_bytes(model, 10) == decode_state_bytes(model, 1000) == (2 * 16 + 16) * 4
    d = width_for_budget("gru", 20_000, vocab=18)
    assert abs(count_params(ArenaLM("gru", 18, d)) - 20_000) < 0.1 * 20_000


def test_width_for_budget_is_the_closest_width_M11_6():
    """The chosen width's parameter count is the closest to the budget among its neighbours."""
    for family in ("softmax", "mamba"):
        d = width_for_budget(family, 20_000, vocab=18)
        gaps = {w: abs(count_params(ArenaLM(family, 18, w)) - 20_000) for w in (d - 4, d, d + 4) if w > 0}
        assert min(gaps, key=gaps.get) == d, gaps


def test_arena_rejects_bad_arguments():
    with pytest.raises(ValueError, match="family must be one of"):
        ArenaLM("rnn", 10)
    with pytest.raises(ValueError, match="task must be one of"):
        train_arena("softmax", "copy", steps=1)
    with pytest.raises(ValueError, match="exceeds max_len"):
        ArenaLM("softmax", 10, max_len=4)(torch.zeros(1, 5, dtype=torch.long))


def test_softmax_learns_small_mqar_M11_2():
    """One seed, 150 steps: softmax attention recalls 4 pairs far above chance (1 / 9 values)."""
    result = train_arena("softmax", "mqar", 4, steps=150, batch=32, d_model=32, seed=0)
    assert result["accuracy"] > 0.6 and result["losses"][-1] < result["losses"][0] / 2, result["accuracy"]


def test_train_arena_returns_the_trained_model_on_request_M11_1():
    """``return_model=True`` adds the trained model (its accuracy is the reported one); the default result is
    unchanged (no model, so it stays JSON-serialisable for the sweep)."""
    kwargs = dict(steps=5, batch=8, d_model=16, n_layers=1, eval_batch=16, seed=3, window=2)
    plain = train_arena("sliding_window", "mqar", 2, **kwargs)
    result = train_arena("sliding_window", "mqar", 2, return_model=True, **kwargs)
    assert "model" not in plain and plain["losses"] == result["losses"]
    model = result["model"]
    assert isinstance(model, ArenaLM) and not model.training and model.window == 2 and len(model.mixers) == 1
    ids, targets = mqar(16, 2, 4 * 2 + 2, generator=torch.Generator().manual_seed(10_000 + 3))
    with torch.no_grad():
        pred = model(ids).argmax(-1)
    keep = targets != PAD
    assert ((pred == targets) & keep).sum().item() / keep.sum().item() == result["accuracy"]


def test_train_arena_early_stopping_M11_2():
    """With ``patience`` the run stops once the validation loss (its own fixed batch) has not improved
    for that many evaluations, and the model tested and returned is the best evaluation's; scoring the
    validation batch does not change the training trajectory."""
    kwargs = dict(steps=60, batch=8, d_model=16, n_layers=1, eval_batch=32, seed=1, lr=3e-2)
    plain = train_arena("softmax", "mqar", 2, **kwargs)
    # min_delta larger than any step's gain: the first evaluation stays the best, patience 2 stops at 30
    early = train_arena("softmax", "mqar", 2, patience=2, eval_every=10, min_delta=100.0, return_model=True,
                        **kwargs)
    assert early["steps_run"] == 30 and early["best_step"] == 10 and len(early["val"]) == 3
    assert early["losses"] == plain["losses"][:30]
    ids, targets = mqar(32, 2, 4 * 2 + 2, generator=torch.Generator().manual_seed(20_000 + 1))
    with torch.no_grad():
        logits = early["model"](ids)
    val_loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=PAD)
    assert val_loss.item() == pytest.approx(early["val"][0][1], rel=1e-6)   # the step-10 model, not step 30's
    assert val_loss.item() != pytest.approx(early["val"][-1][1], rel=1e-3)
    full = train_arena("softmax", "mqar", 2, patience=100, eval_every=7, min_delta=0.0, **kwargs)
    assert full["steps_run"] == 60 and full["losses"] == plain["losses"]
    assert [s for s, *_ in full["val"]] == [7, 14, 21, 28, 35, 42, 49, 56, 60]
    best = min(full["val"], key=lambda v: v[1])
    assert full["best_step"] == best[0]
    with pytest.raises(ValueError, match="patience"):
        train_arena("softmax", "mqar", 2, patience=0, **kwargs)


def _sweep(tmp_path, name, launcher):
    out = tmp_path / f"{name}.json"
    cmd = launcher + [str(ROOT / "benchmarks" / "arena_sweep.py"), "--families", "gla", "--sizes", "4",
                      "--seeds", "0", "--steps", "6", "--batch", "8", "--budget", "6000", "--device", "cpu",
                      "--no-throughput", "--out", str(out)]
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, timeout=300,
                   env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    return json.loads(out.read_text())


def test_torchrun_two_processes_equal_one_process_M11_7(tmp_path):
    """`torchrun --nproc_per_node=2` (gloo, each rank half of the same global batch of 8) gives the loss curve
    of the one-process run to fp32 rounding (the all-reduce sums gradients in another order)."""
    one = _sweep(tmp_path, "one", [sys.executable])
    two = _sweep(tmp_path, "two", [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                   "--nproc_per_node=2"])
    assert two["processes"] == 2 and one["processes"] == 1
    a, b = one["runs"][0]["losses"], two["runs"][0]["losses"]
    assert len(a) == len(b) == 6
    assert all(abs(x - y) <= 1e-5 * abs(x) for x, y in zip(a, b)), (a, b)
    assert a[-1] != a[0]


def test_sweep_throughput_only_merges_and_checks_M11_7(tmp_path):
    """``--throughput-only`` keeps the saved runs, adds throughput ratios to softmax at each length (softmax's
    own is 1), and the ``checks`` entries: the wall time (runs + throughput) against 20 minutes, ok only for a
    complete sweep under it, and one ratio per family and length."""
    out = tmp_path / "arena.json"
    saved = {"config": {"task": "mqar", "sizes": [4], "budget": 6000, "lr": 3e-3}, "complete": True,
             "runs": [{"family": "gla", "size": 4, "seed": 0, "accuracy": 0.5}], "wall_time_s": 1500.0,
             "processes": 1, "threads": 1}
    out.write_text(json.dumps(saved))
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "arena_sweep.py"), "--throughput-only", "--families",
                    "softmax", "gla", "--lengths", "16", "32", "--throughput-rounds", "2", "--out", str(out)],
                   check=True, cwd=ROOT, capture_output=True, timeout=300,
                   env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    result = json.loads(out.read_text())
    assert result["runs"] == saved["runs"] and result["wall_time_s"] == 1500.0
    tp = result["throughput"]
    assert tp["lengths"] == [16, 32] and tp["ratio_to_softmax"]["softmax"] == [1.0, 1.0]
    assert all(0 < r < float("inf") for r in tp["ratio_to_softmax"]["gla"])
    assert tp["widths"]["gla"] == width_for_budget("gla", 6000, vocab=18, max_len=12)   # the saved runs' settings
    wall, ratios = result["checks"]
    assert wall["value"] == round((1500.0 + tp["wall_time_s"]) / 60, 2) and wall["ok"] is False   # 25 min > 20
    assert ratios["value"] == 4 and ratios["ok"] is True
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import arena_sweep
    finally:
        sys.path.pop(0)
    assert arena_sweep.checks({"wall_time_s": 600.0, "complete": True})[0]["ok"] is True
    assert arena_sweep.checks({"wall_time_s": 600.0, "complete": False})[0]["ok"] is False


def test_copy_tasks_are_seeded_and_exact_M11_1():
    """M11.1: the copy target is the source and the reverse target the source backwards, data tokens only;
    the same generator seed gives the same batch, another seed another."""
    from xfam_lib.tasks import N_SPECIAL, copy_task, reverse_task
    src, tgt = copy_task(4, 12, 10, generator=torch.Generator().manual_seed(3))
    again, _ = copy_task(4, 12, 10, generator=torch.Generator().manual_seed(3))
    other, _ = copy_task(4, 12, 10, generator=torch.Generator().manual_seed(4))
    assert torch.equal(tgt, src) and torch.equal(src, again) and not torch.equal(src, other)
    assert int(src.min()) >= N_SPECIAL and int(src.max()) < 10
    rsrc, rtgt = reverse_task(4, 12, 10, generator=torch.Generator().manual_seed(3))
    assert torch.equal(rtgt.flip(-1), rsrc)


def test_ddp_gradient_equals_one_process_only_with_equal_answer_counts_M11_7():
    """DDP averages the ranks' gradients of their slices' mean losses: with the same number of answer positions in
    every slice (every task's sequences have a fixed number) that is the whole batch's gradient; with unequal
    counts it is not, and `check_equal_answer_counts` refuses such a batch."""
    for task, make in TASKS.items():                        # every sequence of every task: the same count
        _, t = make(6, 4, 18, torch.Generator().manual_seed(0), "cpu")
        check_equal_answer_counts(t, 6)
    torch.manual_seed(0)
    model = ArenaLM("softmax", 18, 16, 1, max_len=12).double()
    ids, targets = mqar(8, 4, 18, generator=torch.Generator().manual_seed(1))

    def grad(i, t):
        model.zero_grad()
        F.cross_entropy(model(i).flatten(0, 1), t.flatten(), ignore_index=PAD).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    two_ranks = lambda t: (grad(ids[:4], t[:4]) + grad(ids[4:], t[4:])) / 2
    assert torch.allclose(two_ranks(targets), grad(ids, targets), rtol=0, atol=1e-12)
    uneven = targets.clone()
    uneven[:4, -2:] = PAD                                   # the first rank's slice has fewer answers
    assert not torch.allclose(two_ranks(uneven), grad(ids, uneven), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match=r"same number of answer positions.*\[8, 16\]"):
        check_equal_answer_counts(uneven, 2)


def _arena_sweep_module():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import arena_sweep
    finally:
        sys.path.pop(0)
    return arena_sweep


def test_protocol_grid_holds_the_width_fixed_and_sweeps_every_learning_rate_M11_6():
    """Zoology's protocol: every family at every learning rate; the pairs axis at one width, the width axis at one
    number of pairs, the seeds at one point; no run twice; the best run per setting is the most accurate one."""
    sweep = _arena_sweep_module()
    cfg = sweep.PRESETS["cpu"]
    specs = sweep.protocol_grid(cfg, ["softmax", "gla"])
    keys = [tuple(s.values()) for s in specs]
    assert len(keys) == len(set(keys))
    for f in ("softmax", "gla"):
        plain = [s for s in specs if s["family"] == f and s["gate_bias"] == 0.0]
        assert {s["lr"] for s in plain} == set(cfg["lrs"]) and len(cfg["lrs"]) >= 3
        assert {s["d_model"] for s in plain if s["pairs"] != cfg["pairs_fixed"]} == {cfg["d_fixed"]}
        assert {s["pairs"] for s in plain if s["d_model"] != cfg["d_fixed"]} == {cfg["pairs_fixed"]}
        assert {s["seed"] for s in plain} == set(cfg["seeds"])
        assert {s["seed"] for s in plain if (s["pairs"], s["d_model"]) != (cfg["pairs_fixed"], cfg["d_fixed"])} \
            == {cfg["seeds"][0]}
    assert {s["gate_bias"] for s in specs if s["family"] == "gla"} == {0.0, cfg["gate_bias"]}
    runs = [{"family": "gla", "pairs": 4, "d_model": 32, "seed": 0, "gate_bias": 0.0, "lr": lr, "accuracy": a,
             "loss_last": l} for lr, a, l in ((1e-3, 0.5, 1.0), (3e-3, 0.7, 2.0), (1e-2, 0.7, 1.5))]
    (best,) = sweep.best_runs(runs)
    assert best["lr"] == 1e-2                               # tie on accuracy: the lower final loss


def test_gla_retention_is_the_gate_product_from_value_to_query_M11_6():
    """With the gate projection's weight 0, every gate is sigmoid(b)^(1/16); the measured share kept from a pair's
    value to its query is that gate to the power of their distance, averaged over the queries."""
    sweep = _arena_sweep_module()
    model = ArenaLM("gla", 18, 16, 2, max_len=12)
    for m in model.mixers:
        torch.nn.init.zeros_(m.gate.weight)
        torch.nn.init.constant_(m.gate.bias, 1.0)
    g = torch.sigmoid(torch.tensor(1.0)).item() ** (1 / 16)
    out = sweep.gla_retention(model, 4, 0)
    ids, targets = mqar(64, 4, 18, generator=torch.Generator().manual_seed(20_000))
    rows, q_pos = (targets != PAD).nonzero(as_tuple=True)
    v_pos = torch.tensor([int((ids[r, :8:2] == ids[r, q]).nonzero()) * 2 + 1 for r, q in zip(rows, q_pos)])
    expected = (g ** (q_pos - v_pos).double()).mean().item()
    assert out["mean_gate"] == pytest.approx([g, g], rel=1e-6)
    assert out["kept_to_query"] == pytest.approx([expected, expected], rel=1e-5)


def test_based_features_give_the_taylor_kernel_of_exp_M11_6():
    """Based's linear branch: phi(q).phi(k) = 1 + s + s^2 / 2 with s = q.k / sqrt(feature_dim), per head, the
    second-order Taylor polynomial of exp(s); its state grows with the feature dimension as H (D d_h + D),
    D = 1 + f + f^2."""
    torch.manual_seed(0)
    model = ArenaLM("based", 10, 16, 1, n_heads=2, feature_dim=3, window=2).double()
    mixer = model.mixers[0]
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    fq, fk = mixer.features(x)
    q, k = (t.view(2, 5, 2, 3).transpose(1, 2) for t in mixer.qk_features(x).chunk(2, dim=-1))
    s = q @ k.transpose(-2, -1) / 3 ** 0.5
    assert torch.allclose(fq @ fk.transpose(-2, -1), 1 + s + s ** 2 / 2, rtol=1e-12, atol=1e-12)
    small, big = (decode_state_bytes(ArenaLM("based", 10, 16, 1, feature_dim=f, window=2), 50) for f in (2, 4))
    assert big - small == 2 * ((1 + 4 + 16) - (1 + 2 + 4)) * (8 + 1) * 4


LR_WINDOW = ROOT / "experiments" / "results" / "lr_window.json"
PROTOCOL = ROOT / "benchmarks" / "results" / "arena_protocol.json"


def _protocol_first_losses() -> dict:
    """The protocol's first-step loss per (family, lr, seed) at its learning-rate point (no gate bias)."""
    proto = json.loads(PROTOCOL.read_text())
    cfg = proto["config"]
    return {(r["family"], r["lr"], r["seed"]): r["loss_first"] for r in proto["runs"]
            if (r["pairs"], r["d_model"], r["gate_bias"]) == (cfg["pairs_fixed"], cfg["d_fixed"], 0.0)}


@pytest.mark.slow
def test_lr_window_script_trains_as_the_protocol_does_M11_6(tmp_path):
    """``experiments/lr_window.py --quick``: one run per learning rate, saved after every run, and the same
    model and first batch as the protocol's run at that point (the first loss comes before any update)."""
    out = tmp_path / "lr_window.json"
    subprocess.run([sys.executable, str(ROOT / "experiments" / "lr_window.py"), "--quick", "--families",
                    "softmax", "--out", str(out)], check=True, cwd=ROOT, capture_output=True, timeout=300,
                   env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    result = json.loads(out.read_text())
    cfg = result["config"]
    assert result["complete"] and cfg["steps"] == 30 and cfg["seeds"] == [0]
    assert [(r["family"], r["lr"], r["seed"]) for r in result["runs"]] == [("softmax", lr, 0) for lr in cfg["lrs"]]
    first = _protocol_first_losses()
    shared = [r for r in result["runs"] if ("softmax", r["lr"], 0) in first]
    assert shared
    for r in shared:
        assert r["loss_first"] == pytest.approx(first[("softmax", r["lr"], 0)], rel=1e-5), r
        assert r["loss_last"] < r["loss_first"]


@pytest.mark.slow
def test_converged_sweep_chooses_the_rate_on_validation_and_resumes_M11_6(tmp_path):
    """``experiments/arena_converged.py --quick``: seed 0 at every rate of every point, the other seed at
    the rate whose seed-0 run reached the lowest validation loss (never the test accuracy), every run
    stopped early or at the cap with its validation curve; ``--resume`` keeps them and trains none again."""
    out = tmp_path / "converged.json"
    cmd = [sys.executable, str(ROOT / "experiments" / "arena_converged.py"), "--quick", "--families", "softmax",
           "--out", str(out)]
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, timeout=300, env=env)
    result = json.loads(out.read_text())
    cfg, runs = result["config"], result["runs"]
    pts = {(r["pairs"], r["d_model"]) for r in runs}
    assert result["complete"] and len(pts) == 2 and len(runs) == len(pts) * (len(cfg["lrs"]) + 1)
    for pt in pts:
        first = [r for r in runs if (r["pairs"], r["d_model"], r["seed"]) == (*pt, 0)]
        other = [r for r in runs if (r["pairs"], r["d_model"], r["seed"]) == (*pt, 1)]
        assert sorted(r["lr"] for r in first) == sorted(cfg["lrs"]) and len(other) == 1
        assert other[0]["lr"] == min(first, key=lambda r: min(v[1] for v in r["val"]))["lr"]
    assert all(r["steps_run"] <= cfg["max_steps"] and r["val"][-1][0] == r["steps_run"] for r in runs)
    assert all(r["machine"] == result["machine"] for r in runs)   # each run says where it ran
    # a file another machine wrote: resuming keeps its runs, each with the machine that made it
    elsewhere = {**result["machine"], "cpu_capability": "ELSEWHERE"}
    out.write_text(json.dumps({**result, "machine": elsewhere,
                               "runs": [{k: v for k, v in r.items() if k != "machine"} for r in runs]}))
    subprocess.run(cmd + ["--resume"], check=True, cwd=ROOT, capture_output=True, timeout=300, env=env)
    resumed = json.loads(out.read_text())
    assert [r["machine"] for r in resumed["runs"]] == [elsewhere] * len(runs)
    assert [{k: v for k, v in r.items() if k != "machine"} for r in resumed["runs"]] == \
        [{k: v for k, v in r.items() if k != "machine"} for r in runs]


def test_saved_lr_window_runs_are_complete_and_match_the_protocol_M11_6():
    """Chapter 11's Figure 11.3d reads these runs: every family at every learning rate and seed exactly once, at
    the protocol's learning-rate point, and each run starting where the protocol's run with that seed starts."""
    saved = json.loads(LR_WINDOW.read_text())
    cfg, proto_cfg = saved["config"], json.loads(PROTOCOL.read_text())["config"]
    assert saved["complete"] and cfg["steps"] > proto_cfg["steps"]
    assert (cfg["pairs"], cfg["d_model"], cfg["batch"]) == (proto_cfg["pairs_fixed"], proto_cfg["d_fixed"],
                                                           proto_cfg["batch"])
    assert set(proto_cfg["lrs"]) < set(cfg["lrs"]) and len(set(cfg["seeds"])) >= 3
    keys = [(r["family"], r["lr"], r["seed"]) for r in saved["runs"]]
    assert sorted(keys) == sorted((f, lr, s) for f in cfg["families"] for lr in cfg["lrs"] for s in cfg["seeds"])
    assert all(0.0 <= r["accuracy"] <= 1.0 and r["wall_s"] > 0 for r in saved["runs"])
    first = _protocol_first_losses()
    for r in saved["runs"]:
        if (r["family"], r["lr"], r["seed"]) in first:
            assert r["loss_first"] == pytest.approx(first[(r["family"], r["lr"], r["seed"])], rel=1e-5), r
