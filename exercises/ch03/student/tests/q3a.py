from otter.test_files import test_case

OK_FORMAT = False

name = "q3a"
points = [0]

@test_case(points=None, hidden=False)
def test_q3a_public(logn_factor):
    import math
    from xfam_grading import check_cases

    def make_case(p):
        return dict(p)

    def submission(c):
        return logn_factor(c['n'], c['train_len'])

    def reference(c):
        return {(4096, 512): 12 / 9, (64, 64): 1.0, (128, 512): 7 / 9}[c['n'], c['train_len']]
    check_cases('factors', params=[{'n': 4096, 'train_len': 512}, {'n': 64, 'train_len': 64}, {'n': 128, 'train_len': 512}], make_case=make_case, submission=submission, reference=reference)

