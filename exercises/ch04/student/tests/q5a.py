from otter.test_files import test_case

OK_FORMAT = False

name = "q5a"
points = [0]

@test_case(points=None, hidden=False)
def test_q5a_public(da_weight):
    import math
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        return {'dist': torch.tensor(p['dist'], dtype=getattr(torch, p['dtype'])), 'alpha': p['alpha'], 'beta': p['beta']}

    def submission(c):
        return da_weight(c['dist'], c['alpha'], c['beta'])

    def reference(c):
        a, b = (c['alpha'], c['beta'])
        f = [(1 + math.exp(b)) / (1 + math.exp(b - a * x)) if b - a * x < 700 else 0.0 for x in c['dist'].tolist()]
        return torch.tensor(f, dtype=c['dist'].dtype)
    check_cases('weights', params=[{'dist': (0.0, 1.0, 2.5, 10.0, 1000.0, 100000.0), 'dtype': 'float64', 'alpha': -0.5, 'beta': 1.0}, {'dist': (0.0, 1.0, 3.0, 50.0), 'dtype': 'float32', 'alpha': 0.3, 'beta': 2.0}], make_case=make_case, submission=submission, reference=reference)

