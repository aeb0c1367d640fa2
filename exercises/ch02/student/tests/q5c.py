from otter.test_files import test_case

OK_FORMAT = False

name = "q5c"
points = [0]

@test_case(points=None, hidden=False)
def test_q5c_public(score_flops):
    from xfam_grading import check_cases

    def make_case(p):
        return {'L': p['L'], 'd': p['d'], 'd_h': p['d_h']}

    def submission(c):
        return tuple(score_flops(c['L'], c['d'], c['d_h']))

    def reference(c):
        L, d, d_h = (c['L'], c['d'], c['d_h'])
        dot = sum((2 * d for i in range(L) for j in range(L)))
        additive = 2 * (2 * d * d_h * L) + sum((2 * d_h for i in range(L) for j in range(L)))
        return (dot, additive)
    check_cases('sizes', params=[{'L': 4, 'd': 3, 'd_h': 2}, {'L': 7, 'd': 3, 'd_h': 5}], make_case=make_case, submission=submission, reference=reference)

