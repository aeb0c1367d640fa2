from otter.test_files import test_case

OK_FORMAT = False

name = "q4b"
points = [0]

@test_case(points=None, hidden=False)
def test_q4b_public(online_softmax):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        kind, n = (p['stream'], p['n'])
        if kind == 'given':
            return [float(v) for v in p['values']]
        if kind == 'rising':
            return [float(5 * j) for j in range(n)]
        if kind == 'huge and negative':
            return [float(v) for v in -3000.0 + 500.0 * torch.randn(n, dtype=torch.float64)]
        if kind == 'ties':
            return [700.0] * n
        return [float(v) for v in p['scale'] * torch.randn(n, dtype=torch.float64)]

    def submission(c):
        return online_softmax((v for v in c))

    def reference(c):
        return torch.softmax(torch.tensor(c, dtype=torch.float64), 0)
    check_cases('small streams', params=[{'stream': 'given', 'n': 4, 'values': (1.0, 3.0, 2.0, 5.0)}, {'stream': 'given', 'n': 3, 'values': (1000.0, 1001.0, 1002.0)}, {'stream': 'rising', 'n': 6}], make_case=make_case, submission=submission, reference=reference)

