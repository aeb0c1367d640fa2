from otter.test_files import test_case

OK_FORMAT = False

name = "q4b"
points = [0]

@test_case(points=None, hidden=False)
def test_q4b_public(hillis_steele):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        shape = (*p['batch'], p['L'])
        return {'a': torch.empty(shape, dtype=torch.float64).uniform_(-1.0, 1.0), 'b': torch.randn(shape, dtype=torch.float64)}

    def submission(c):
        calls = []

        def counted_combine(first, then):
            calls.append(1)
            (a1, b1), (a2, b2) = (first, then)
            return (a2 * a1, a2 * b1 + b2)
        x = hillis_steele(c['a'], c['b'], counted_combine)
        return {'x': x, 'combine calls': len(calls)}

    def reference(c):
        a, b = (c['a'], c['b'])
        x, xs = (torch.zeros_like(a[..., 0]), [])
        for t in range(a.shape[-1]):
            x = a[..., t] * x + b[..., t]
            xs.append(x)
        return {'x': torch.stack(xs, dim=-1), 'combine calls': (a.shape[-1] - 1).bit_length()}
    check_cases('scans', params=[{'batch': (), 'L': 5}, {'batch': (2,), 'L': 8}, {'batch': (2, 3), 'L': 1}, {'batch': (3,), 'L': 13}], make_case=make_case, submission=submission, reference=reference)

