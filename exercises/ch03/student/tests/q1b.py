from otter.test_files import test_case

OK_FORMAT = False

name = "q1b"
points = [0]

@test_case(points=None, hidden=False)
def test_q1b_public(scaled_variance):
    from xfam_grading import check_cases

    def make_case(p):
        return dict(p)

    def submission(c):
        return scaled_variance(c['d_k'], c['alpha'], c['mean'], c['var'])

    def reference(c):
        return {(128, 0.5): 1.0, (64, 0.0): 16.0, (10, 1.0): 0.3}[c['d_k'], c['alpha']]
    check_cases('worked examples', params=[{'d_k': 128, 'alpha': 0.5, 'mean': 0.0, 'var': 1.0}, {'d_k': 64, 'alpha': 0.0, 'mean': 0.0, 'var': 0.5}, {'d_k': 10, 'alpha': 1.0, 'mean': 1.0, 'var': 1.0}], make_case=make_case, submission=submission, reference=reference)

