from otter.test_files import test_case

OK_FORMAT = False

name = "q2a"
points = [0]

@test_case(points=None, hidden=False)
def test_q2a_public(rope):
    import math
    import torch
    from xfam_grading import check_cases, output_problems

    def rotation(p, d, base):
        """The explicit block-diagonal rotation R_p of the interleaved layout, float64."""
        R = torch.zeros(d, d, dtype=torch.float64)
        for i in range(d // 2):
            a = p * base ** (-2 * i / d)
            R[2 * i:2 * i + 2, 2 * i:2 * i + 2] = torch.tensor([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]], dtype=torch.float64)
        return R

    def make_case(p):
        shape = p['x shape']
        return {'x': torch.randn(*shape, dtype=getattr(torch, p['dtype'])), 'q': torch.randn(shape[-1], dtype=torch.float64), 'k': torch.randn(shape[-1], dtype=torch.float64), 'positions': torch.randint(0, 60, (shape[-2],)), 'base': p['base'], 'interleaved': p['interleaved'], 'shift': p['shift']}

    def submission(c):
        import torch
        base, interleaved = (c['base'], c['interleaved'])
        y = rope(c['x'], c['positions'], base=base, interleaved=interleaved)
        scores = []
        for m, n in ((3, 9), (3 + c['shift'], 9 + c['shift'])):
            qm = rope(c['q'][None], torch.tensor([m]), base=base, interleaved=interleaved)[0]
            kn = rope(c['k'][None], torch.tensor([n]), base=base, interleaved=interleaved)[0]
            scores.append(float((qm * kn).sum()))
        return {'rope': y, 'norms': y.double().norm(dim=-1) if isinstance(y, torch.Tensor) else y, 'scores at (3, 9) and shifted': torch.tensor(scores, dtype=torch.float64)}

    def reference(c):
        d = c['x'].shape[-1]
        perm = torch.arange(d) if c['interleaved'] else torch.cat((torch.arange(0, d, 2), torch.arange(1, d, 2)))

        def fn(t, pos):
            xi = torch.empty_like(t, dtype=torch.float64)
            xi[..., perm] = t.double()
            rows = [xi[..., l, :] @ rotation(int(p), d, c['base']).T for l, p in enumerate(pos.tolist())]
            return torch.stack(rows, dim=-2)[..., perm].to(t.dtype)
        scores = [float((fn(c['q'][None], torch.tensor([m]))[0] * fn(c['k'][None], torch.tensor([n]))[0]).sum()) for m, n in ((3, 9), (3 + c['shift'], 9 + c['shift']))]
        return {'rope': fn(c['x'], c['positions']), 'norms': c['x'].double().norm(dim=-1), 'scores at (3, 9) and shifted': torch.tensor(scores, dtype=torch.float64)}

    def compare(c, got, expected):
        key = 'scores at (3, 9) and shifted'
        problems = []
        if isinstance(got, dict) and isinstance(got.get(key), torch.Tensor) and (got[key].shape == (2,)):
            s = got[key]
            moved = abs(float(s[1] - s[0]))
            if not moved <= 1e-08 * (float(s.abs().max()) + 1.0):
                problems.append(f"{key}: q.k changed by {moved:.3g} when query and key positions both moved by {c['shift']} (it may depend only on n - m)")
        norm_tol = 1e-05 if c['x'].dtype == torch.float32 else 1e-10
        if isinstance(got, dict) and isinstance(got.get('norms'), torch.Tensor) and (got['norms'].shape == expected['norms'].shape):
            change = float((got['norms'] - expected['norms']).abs().max()) if got['norms'].numel() else 0.0
            if not change <= norm_tol * (float(expected['norms'].abs().max()) + 1.0):
                problems.append(f"norms: the rotation changed a vector's norm by {change:.3g}")
        problems += output_problems({k: v for k, v in got.items() if k != 'norms'} if isinstance(got, dict) else got, {k: v for k, v in expected.items() if k != 'norms'})
        if problems:
            raise AssertionError('; '.join(problems))
    check_cases('small', params=[{'x shape': (2, 5, 8), 'dtype': 'float64', 'base': 10000.0, 'interleaved': False, 'shift': 50}, {'x shape': (2, 5, 8), 'dtype': 'float64', 'base': 10000.0, 'interleaved': True, 'shift': 50}, {'x shape': (3, 6), 'dtype': 'float32', 'base': 100.0, 'interleaved': False, 'shift': 7}], make_case=make_case, submission=submission, reference=reference, compare=compare)

