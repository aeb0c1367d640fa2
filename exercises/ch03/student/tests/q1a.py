from otter.test_files import test_case

OK_FORMAT = False

name = "q1a"
points = [0]

@test_case(points=None, hidden=False)
def test_q1a_public(qk_variance):
    from xfam_grading import check_cases

    def make_case(p):
        return dict(p)

    def exact(c):
        return float(c['d_k'] * (c['var'] ** 2 + 2 * c['var'] * c['mean'] ** 2))

    def submission(c):
        return qk_variance(c['d_k'], c['mean'], c['var'])

    def reference(c):
        return exact(c)
    check_cases('worked examples', params=[{'d_k': 128, 'mean': 0.0, 'var': 1.0}, {'d_k': 64, 'mean': 0.0, 'var': 0.5}, {'d_k': 10, 'mean': 1.0, 'var': 1.0}], make_case=make_case, submission=submission, reference=reference)

