from otter.test_files import test_case

OK_FORMAT = False

name = "q5b"
points = [0]

@test_case(points=None, hidden=False)
def test_q5b_public(score_dot_products):
    from xfam_grading import check_cases

    def make_case(p):
        return dict(p)

    def submission(c):
        return tuple(score_dot_products(c['T']))

    def reference(c):
        T = c['T']
        with_cache = sum((len(range(t)) for t in range(1, T + 1)))
        without_cache = sum((len(range(t)) * len(range(t)) for t in range(1, T + 1)))
        return (with_cache, without_cache)
    check_cases('counts', params=[{'T': 3}, {'T': 1}], make_case=make_case, submission=submission, reference=reference)

