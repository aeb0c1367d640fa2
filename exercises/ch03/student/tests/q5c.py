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
        h, kv, world = (c['heads'], c['kv heads'], c['ranks'])
        if h % world or kv % world or h % kv:
            return 'ValueError'
        return (h // world, kv // world, h // kv)
    check_cases('splits', params=[{'heads': 32, 'kv heads': 8, 'ranks': 8}, {'heads': 32, 'kv heads': 8, 'ranks': 16}], make_case=make_case, submission=submission, reference=reference)

