from otter.test_files import test_case

OK_FORMAT = False

name = "q2"
points = [0]

@test_case(points=None, hidden=False)
def test_q2_public(rope, pairs_short_of_one_turn):
    import math
    import torch
    from xfam_lib.grading import check_cases, compare_outputs

    def rotation(p, d, base):
        """The explicit block-diagonal rotation R_p of the interleaved layout, float64."""
        R = torch.zeros(d, d, dtype=torch.float64)
        for i in range(d // 2):
            a = p * base ** (-2 * i / d)
            R[2 * i:2 * i + 2, 2 * i:2 * i + 2] = torch.tensor([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]], dtype=torch.float64)
        return R

    def make_case(p):
        shape, base, interleaved, shift, counts = p
        L = shape[-2]
        return {'x': torch.randn(*shape), 'q': torch.randn(shape[-1]), 'k': torch.randn(shape[-1]), 'positions': torch.randint(0, 60, (L,)), 'base': base, 'interleaved': interleaved, 'shift': shift, 'counts': counts}

    def scores(c, fn):
        """q.k for query/key positions (3, 9) and both shifted by `shift`."""
        out = []
        for m, n in ((3, 9), (3 + c['shift'], 9 + c['shift'])):
            qm = fn(c['q'][None].double(), torch.tensor([m]))[0]
            kn = fn(c['k'][None].double(), torch.tensor([n]))[0]
            out.append(float((qm * kn).sum()))
        return torch.tensor(out, dtype=torch.float64)

    def submission(c):
        fn = lambda t, pos: rope(t, pos, base=c['base'], interleaved=c['interleaved'])
        y = fn(c['x'], c['positions'])
        return {'rope': y, 'norms': y.norm(dim=-1) if isinstance(y, torch.Tensor) else y, 'scores at (3, 9) and shifted': scores(c, fn), 'pairs_short_of_one_turn': [pairs_short_of_one_turn(*args) for args in c['counts']]}

    def reference(c):
        d = c['x'].shape[-1]
        perm = torch.arange(d) if c['interleaved'] else torch.cat((torch.arange(0, d, 2), torch.arange(1, d, 2)))

        def fn(t, pos):
            xi = torch.empty_like(t, dtype=torch.float64)
            xi[..., perm] = t.double()
            rows = [xi[..., l, :] @ rotation(int(p), d, c['base']).T for l, p in enumerate(pos.tolist())]
            return torch.stack(rows, dim=-2)[..., perm].to(t.dtype)
        counts = [sum((1 for i in range(d_ // 2) if L_ * b_ ** (-2 * i / d_) < 2 * math.pi)) for L_, d_, b_ in c['counts']]
        y = fn(c['x'], c['positions'])
        return {'rope': y, 'norms': c['x'].norm(dim=-1), 'scores at (3, 9) and shifted': scores(c, fn), 'pairs_short_of_one_turn': counts}

    def compare(c, got, expected):
        key = 'scores at (3, 9) and shifted'
        if not isinstance(got, dict):
            compare_outputs(got, expected)
        compare_outputs({k: v for k, v in got.items() if k != key}, {k: v for k, v in expected.items() if k != key})
        s, ref = (got.get(key), expected[key])
        if isinstance(s, torch.Tensor) and s.shape == ref.shape and bool(torch.isfinite(s).all()):
            tol = 0.0001 * (float(ref.abs().max()) + 1.0)
            moved = abs(float(s[1] - s[0]))
            assert moved <= tol, f"{key}: q.k changed by {moved:.3g} when query and key positions both moved by {c['shift']} (expected no change: the score may depend only on n - m)"
            err = float((s - ref).abs().max())
            assert err <= tol, f'{key}: expected {ref.tolist()}, got {s.tolist()} (max abs error {err:.3g})'
        else:
            compare_outputs(s, ref, where=key)
    check_cases('small', params=[((2, 5, 8), 10000.0, False, 50, ((2048, 128, 10000.0),)), ((2, 5, 8), 10000.0, True, 50, ((2048, 128, 10000.0),))], make_case=make_case, submission=submission, reference=reference, compare=compare, isolated=False)

