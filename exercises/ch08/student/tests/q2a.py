from otter.test_files import test_case

OK_FORMAT = False

name = "q2a"
points = [0]

@test_case(points=None, hidden=False)
def test_q2a_public(positive_features):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        x = p['x scale'] * torch.randn(*p['leading dims'], p['d'], dtype=torch.float64)
        return {'x': x, 'W': torch.randn(p['m'], p['d'], dtype=torch.float64)}

    def submission(c):
        return positive_features(c['x'], c['W'])

    def reference(c):
        from xfam_lib.linear import positive_random_features
        return positive_random_features(c['x'], c['W'])
    check_cases('small inputs', params=[{'leading dims': (3,), 'd': 4, 'm': 8, 'x scale': 0.5}, {'leading dims': (2, 5), 'd': 2, 'm': 3, 'x scale': 1.0}, {'leading dims': (4,), 'd': 8, 'm': 16, 'x scale': 0.3}], make_case=make_case, submission=submission, reference=reference)

