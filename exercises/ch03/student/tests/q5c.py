from otter.test_files import test_case

OK_FORMAT = False

name = "q5c"
points = [0]

@test_case(points=None, hidden=False)
def test_q5c_public(tp_local_heads):
    from xfam_grading import check_cases

    def make_case(p):
        return dict(p)

    def submission(c):
        try:
            return tuple(tp_local_heads(c['heads'], c['kv heads'], c['ranks']))
        except ValueError:
            return 'ValueError'

    def reference(c):
        return {(32, 8, 8): (4, 1, 4), (32, 8, 16): 'ValueError'}[c['heads'], c['kv heads'], c['ranks']]
    check_cases('splits', params=[{'heads': 32, 'kv heads': 8, 'ranks': 8}, {'heads': 32, 'kv heads': 8, 'ranks': 16}], make_case=make_case, submission=submission, reference=reference)

