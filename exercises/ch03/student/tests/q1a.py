from otter.test_files import test_case

OK_FORMAT = False

name = "q1a"
points = [0]

@test_case(points=None, hidden=False)
def test_q1a_public(qk_variance):
    from xfam_grading import check_cases

    def make_case(p):
        return dict(p)

    def submission(c):
        return qk_variance(c['d_k'], c['mean'], c['var'])

    def reference(c):
        return {(128, 0.0, 1.0): 128.0, (64, 0.0, 0.5): 16.0, (10, 1.0, 1.0): 30.0}[c['d_k'], c['mean'], c['var']]
    check_cases('worked examples', params=[{'d_k': 128, 'mean': 0.0, 'var': 1.0}, {'d_k': 64, 'mean': 0.0, 'var': 0.5}, {'d_k': 10, 'mean': 1.0, 'var': 1.0}], make_case=make_case, submission=submission, reference=reference)

