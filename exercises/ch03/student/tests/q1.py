from otter.test_files import test_case

OK_FORMAT = False

name = "q1"
points = [0]

@test_case(points=None, hidden=False)
def test_q1_public(qk_variance, scaled_variance):
    from xfam_lib.grading import check_cases

    def submission(c):
        d_k, mean, var, alpha = c
        return {'qk_variance': qk_variance(d_k, mean, var), 'scaled_variance': scaled_variance(d_k, alpha, mean, var)}

    def reference(c):
        d_k, mean, var, alpha = c
        exact = float(d_k * (var ** 2 + 2 * var * mean ** 2))
        return {'qk_variance': exact, 'scaled_variance': exact / float(d_k) ** (2 * alpha)}
    check_cases('worked examples', params=[(128, 0.0, 1.0, 0.5), (64, 0.0, 0.5, 0.0), (10, 1.0, 1.0, 1.0)], make_case=lambda p: p, submission=submission, reference=reference, isolated=False)

