from otter.test_files import test_case

OK_FORMAT = False

name = "q4a"
points = [0]

@test_case(points=None, hidden=False)
def test_q4a_public(combine):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        shape = tuple(p['shape'])
        return {'first': [torch.randn(shape, dtype=torch.float64), torch.randn(shape, dtype=torch.float64)], 'then': [torch.randn(shape, dtype=torch.float64), torch.randn(shape, dtype=torch.float64)], 'x': torch.randn(shape, dtype=torch.float64)}

    def submission(c):
        a, b = combine(tuple(c['first']), tuple(c['then']))
        return {'a': a, 'b': b, 'map applied to x': a * c['x'] + b}

    def reference(c):
        (a1, b1), (a2, b2), x = (c['first'], c['then'], c['x'])
        return {'a': a2 * a1, 'b': a2 * b1 + b2, 'map applied to x': a2 * (a1 * x + b1) + b2}
    check_cases('compositions', params=[{'shape': ()}, {'shape': (5,)}, {'shape': (2, 3)}], make_case=make_case, submission=submission, reference=reference)

