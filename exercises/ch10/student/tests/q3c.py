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
        return {'with the target equal to the return': returns_to_go(c['rewards'][(0,) * (c['rewards'].dim() - 1)])}

    def compare(c, got, expected):
        """With the target equal to the return: the returns-to-go; with any target: it comes first,
        then each step's value is the one before minus the reward just received."""
        from xfam_grading import output_problems
        if not isinstance(got, dict) or not isinstance(got.get('with the target'), torch.Tensor):
            raise AssertionError('expected a tensor of returns to feed, one per step')
        key = 'with the target equal to the return'
        problems = output_problems(got.get(key), expected[key], key)
        fed, r = (got['with the target'], c['rewards'])
        if fed.shape != r.shape or fed.dtype != r.dtype:
            problems.append(f'with the target: shape {tuple(fed.shape)} and dtype {fed.dtype}, expected {tuple(r.shape)} and {r.dtype} (one value per step)')
        else:
            first = torch.full(r.shape[:-1], float(c['target']), dtype=r.dtype)
            problems += output_problems(fed[..., 0], first, 'with the target: the first step (the target)')
            problems += output_problems(fed[..., :-1] - fed[..., 1:], r[..., :-1], 'with the target: the drop from each step to the next (its reward)')
        if problems:
            raise AssertionError('; '.join(problems))
    check_cases('episodes', params=[{'shape': (5,), 'rewards': '0/1', 'target': 4.0}, {'shape': (3, 6), 'rewards': 'random', 'target': 2.5}, {'shape': (2, 2, 4), 'rewards': '0/1', 'target': 0.0}], make_case=make_case, submission=submission, reference=reference, compare=compare)

