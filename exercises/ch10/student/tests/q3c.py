from otter.test_files import test_case

OK_FORMAT = False

name = "q3c"
points = [0]

@test_case(points=None, hidden=False)
def test_q3c_public(conditioning_returns):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        shape = tuple(p['shape'])
        rewards = (torch.rand(*shape) < 0.5).double() if p['rewards'] == '0/1' else torch.randn(*shape, dtype=torch.float64)
        return {'rewards': rewards, 'target': p['target']}

    def submission(c):
        first = c['rewards'][(0,) * (c['rewards'].dim() - 1)]
        return {'with the target': conditioning_returns(c['target'], c['rewards']), 'with the target equal to the return': conditioning_returns(float(first.sum()), first)}

    def reference(c):
        from xfam_lib.rl import returns_to_go
        r, target = (c['rewards'], c['target'])
        fed = torch.stack([target - r[..., :t].sum(-1) for t in range(r.shape[-1])], dim=-1)
        return {'with the target': fed, 'with the target equal to the return': returns_to_go(r[(0,) * (r.dim() - 1)])}
    check_cases('episodes', params=[{'shape': (5,), 'rewards': '0/1', 'target': 4.0}, {'shape': (3, 6), 'rewards': 'random', 'target': 2.5}, {'shape': (2, 2, 4), 'rewards': '0/1', 'target': 0.0}], make_case=make_case, submission=submission, reference=reference)

