from otter.test_files import test_case

OK_FORMAT = False

name = "q4b"
points = [0]

@test_case(points=None, hidden=False)
def test_q4b_public(return_conditioned_policy):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        n, A, T = (p['episodes'], p['actions'], p['steps'])
        g = torch.Generator().manual_seed(p['seed'])
        actions = torch.randint(A, (n, T), generator=g)
        luck = torch.randint(2, (n, T), generator=g).double()
        rewards = torch.where(actions == 0, torch.full((n, T), 0.5, dtype=torch.float64), luck)
        target = float(rewards.sum(1)[p['pick'] % n])
        return {'actions': actions, 'rewards': rewards, 'target': target, 'n_actions': A}

    def submission(c):
        return return_conditioned_policy(c['actions'], c['rewards'], c['target'], c['n_actions'])

    def reference(c):
        from xfam_lib.rl import returns_to_go
        rtg = returns_to_go(c['rewards'])
        hit = rtg == c['target']
        counts = torch.bincount(c['actions'][hit], minlength=c['n_actions']).double()
        return counts / counts.sum()
    check_cases('logged data', params=[{'episodes': 200, 'steps': 1, 'actions': 2, 'seed': 0, 'pick': 3}, {'episodes': 100, 'steps': 4, 'actions': 3, 'seed': 1, 'pick': 7}, {'episodes': 50, 'steps': 6, 'actions': 2, 'seed': 2, 'pick': 0}], make_case=make_case, submission=submission, reference=reference)

