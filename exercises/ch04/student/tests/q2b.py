from otter.test_files import test_case

OK_FORMAT = False

name = "q2b"
points = [0]

@test_case(points=None, hidden=False)
def test_q2b_public(pairs_short_of_one_turn):
    import math
    from xfam_grading import check_cases

    def make_case(p):
        return dict(p)

    def submission(c):
        return pairs_short_of_one_turn(c['train_len'], c['d'], c['base'])

    def reference(c):
        return sum((1 for i in range(c['d'] // 2) if c['train_len'] * c['base'] ** (-2 * i / c['d']) < 2 * math.pi))
    check_cases('counts', params=[{'train_len': 2048, 'd': 128, 'base': 10000.0}, {'train_len': 64, 'd': 12, 'base': 100.0}], make_case=make_case, submission=submission, reference=reference)

