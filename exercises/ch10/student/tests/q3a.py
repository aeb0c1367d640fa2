from otter.test_files import test_case

OK_FORMAT = False

name = "q3a"
points = [0]

@test_case(points=None, hidden=False)
def test_q3a_public(rtg_from_rewards):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        shape = tuple(p['shape'])
        if p['rewards'] == 'given':
            rewards = torch.tensor(p['values'], dtype=torch.float64)
        elif p['rewards'] == 'sparse':
            rewards = torch.zeros(*shape, dtype=torch.float64)
            rewards[..., -1] = 1.0
        else:
            rewards = torch.randn(*shape, dtype=torch.float64)
        return {'rewards': rewards, 'gamma': p['gamma']}

    def submission(c):
        return rtg_from_rewards(c['rewards'], c['gamma'])

    def reference(c):
        from xfam_lib.rl import returns_to_go
        return returns_to_go(c['rewards'], c['gamma'])
    check_cases('small trajectories', params=[{'rewards': 'given', 'shape': (4,), 'values': (1.0, 0.0, 2.0, 3.0), 'gamma': 1.0}, {'rewards': 'given', 'shape': (3,), 'values': (1.0, 1.0, 1.0), 'gamma': 0.5}, {'rewards': 'random', 'shape': (2, 3, 6), 'gamma': 1.0}, {'rewards': 'random', 'shape': (3, 5), 'gamma': 0.9}], make_case=make_case, submission=submission, reference=reference)

