from otter.test_files import test_case

OK_FORMAT = False

name = "q6a"
points = [0]

@test_case(points=None, hidden=False)
def test_q6a_public(delta_rule_recurrent):
    import torch
    from xfam_grading import check_cases

    def probe_case(p):
        key = torch.nn.functional.normalize(torch.randn(*p['leading dims'], 1, p['d_k'], dtype=torch.float64), dim=-1)
        k = torch.cat([key, key], dim=-2)
        return {'q': k.clone(), 'k': k, 'v': torch.randn(*p['leading dims'], 2, p['d_v'], dtype=torch.float64), 'beta': torch.full((*p['leading dims'], 2), p['beta'], dtype=torch.float64), 'initial_state': None}

    def probe_reference(c):
        b, v0, v1 = (c['beta'][..., :1], c['v'][..., 0, :], c['v'][..., 1, :])
        first = b * v0
        return {'out': torch.stack([first, first + b * (v1 - first)], dim=-2), 'final state': c['k'][..., 0, :, None] * (first + b * (v1 - first))[..., None, :]}

    def probe_compare(c, got, expected):
        from xfam_grading.compare import mistake_hints, output_problems
        problems = output_problems(got, expected)
        problems += mistake_hints(got, expected, c) if problems else []
        out = got.get('out') if isinstance(got, dict) else None
        if problems and isinstance(out, torch.Tensor) and (out.shape == expected['out'].shape):
            b, v0, v1 = (c['beta'][..., :1], c['v'][..., 0, :], c['v'][..., 1, :])
            if torch.allclose(out[..., 1, :], b * (v0 + v1)):
                problems.append("hint: your second read is beta (v_0 + v_1): the state added the second value to the first, as linear attention's sum does; the delta rule writes beta_t (v_t - S_{t-1}^T k_t), the value minus what the state already returns")
            elif torch.allclose(out[..., 0, :], v0) and (not torch.allclose(b, torch.ones_like(b))):
                problems.append('hint: after one write with beta < 1 your read returns all of v_0: the correction v_t - S_{t-1}^T k_t must be scaled by beta_t')
        if problems:
            raise AssertionError('; '.join(problems))

    def submission(c):
        out, S = delta_rule_recurrent(c['q'], c['k'], c['v'], c['beta'], c['initial_state'])
        return {'out': out, 'final state': S}
    check_cases('one unit key written twice', params=[{'leading dims': (), 'd_k': 4, 'd_v': 3, 'beta': 1.0}, {'leading dims': (2,), 'd_k': 3, 'd_v': 2, 'beta': 0.5}], make_case=probe_case, submission=submission, reference=probe_reference, compare=probe_compare)

    def make_case(p):
        shape = tuple(p['leading dims']) + (p['L'],)
        k = torch.randn(*shape, p['d_k'], dtype=torch.float64)
        k = torch.nn.functional.normalize(k, dim=-1) if p['keys'] == 'unit' else 0.8 * k / p['d_k'] ** 0.5
        low, high = p['beta range']
        state = torch.randn(*p['leading dims'], p['d_k'], p['d_v'], dtype=torch.float64)
        return {'q': torch.randn(*shape, p['d_k'], dtype=torch.float64), 'k': k, 'v': torch.randn(*shape, p['d_v'], dtype=torch.float64), 'beta': low + (high - low) * torch.rand(*shape, dtype=torch.float64), 'initial_state': state if p['initial state'] == 'random' else None}

    def reference(c):
        from xfam_lib.linear import delta_rule
        out, S = delta_rule(c['q'], c['k'], c['v'], c['beta'], scale=1.0, initial_state=c['initial_state'], return_final_state=True)
        return {'out': out, 'final state': S}
    check_cases('small sequences', params=[{'leading dims': (2,), 'L': 6, 'd_k': 3, 'd_v': 2, 'keys': 'unit', 'beta range': (0.0, 1.0), 'initial state': 'none'}, {'leading dims': (1, 2), 'L': 5, 'd_k': 4, 'd_v': 3, 'keys': 'random length', 'beta range': (0.2, 0.9), 'initial state': 'random'}, {'leading dims': (), 'L': 7, 'd_k': 2, 'd_v': 5, 'keys': 'random length', 'beta range': (0.5, 1.0), 'initial state': 'none'}], make_case=make_case, submission=submission, reference=reference)

