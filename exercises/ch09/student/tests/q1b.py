from otter.test_files import test_case

OK_FORMAT = False

name = "q1b"
points = [0]

@test_case(points=None, hidden=False)
def test_q1b_public(zoh_diagonal):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        h, n = (p['H'], p['N'])
        A = -torch.exp(torch.randn(h, n, dtype=torch.float64))
        if p['entries'] == 'zero and tiny':
            A[:, 0] = 0.0
            A[:, 1] = -1e-10 * (1.0 + torch.rand(h, dtype=torch.float64))
        delta = torch.exp(torch.empty(h, dtype=torch.float64).uniform_(-6.0, 0.0))
        return {'A': A, 'B': torch.randn(h, n, dtype=torch.float64), 'delta': delta}

    def submission(c):
        A_bar, B_bar = zoh_diagonal(c['A'], c['B'], c['delta'])
        return {'A_bar': A_bar, 'B_bar': B_bar}

    def reference(c):
        from xfam_lib.ssm import discretize
        A_bar, B_bar = discretize(c['A'], c['B'], c['delta'], 'zoh')
        return {'A_bar': A_bar, 'B_bar': B_bar}
    check_cases('diagonal zoh', params=[{'H': 3, 'N': 4, 'entries': 'random'}, {'H': 2, 'N': 5, 'entries': 'zero and tiny'}, {'H': 4, 'N': 2, 'entries': 'zero and tiny'}], make_case=make_case, submission=submission, reference=reference)

