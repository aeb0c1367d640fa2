from otter.test_files import test_case

OK_FORMAT = False

name = "q1a"
points = [0]

@test_case(points=None, hidden=False)
def test_q1a_public(zoh):
    import math
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        n = p['N']
        if p['A'] == 'zero':
            A = torch.zeros(n, n, dtype=torch.float64)
        elif p['A'] == 'integrator chain':
            A = torch.diag(torch.ones(n - 1, dtype=torch.float64), 1)
        else:
            A = torch.randn(n, n, dtype=torch.float64) / math.sqrt(n) - 0.5 * torch.eye(n, dtype=torch.float64)
        return {'A': A, 'B': torch.randn(n, dtype=torch.float64), 'delta': p['delta']}

    def submission(c):
        A_bar, B_bar = zoh(c['A'], c['B'], c['delta'])
        return {'A_bar': A_bar, 'B_bar': B_bar}

    def reference(c):
        A, B, delta = (c['A'], c['B'], c['delta'])
        term, B_bar = (delta * B, torch.zeros_like(B))
        for k in range(1, 80):
            B_bar = B_bar + term
            term = delta * (A @ term) / (k + 1)
        return {'A_bar': torch.linalg.matrix_exp(delta * A), 'B_bar': B_bar}
    check_cases('zoh', params=[{'N': 3, 'A': 'random', 'delta': 0.5}, {'N': 2, 'A': 'integrator chain', 'delta': 0.3}, {'N': 3, 'A': 'zero', 'delta': 0.1}, {'N': 4, 'A': 'random', 'delta': 1.0}], make_case=make_case, submission=submission, reference=reference)

