from otter.test_files import test_case

OK_FORMAT = False

name = "q5a"
points = [0]

@test_case(points=None, hidden=False)
def test_q5a_public(xl_mask):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        return dict(p)

    def submission(c):
        return xl_mask(c['seg_len'], c['mem_len'], c['window'])

    def reference(c):
        from xfam_lib.attention import causal_mask
        return causal_mask(c['seg_len'], c['mem_len'] + c['seg_len'], window=c['window'])
    check_cases('masks', params=[{'seg_len': 4, 'mem_len': 0, 'window': None}, {'seg_len': 3, 'mem_len': 5, 'window': None}, {'seg_len': 5, 'mem_len': 2, 'window': None}, {'seg_len': 4, 'mem_len': 4, 'window': 3}, {'seg_len': 3, 'mem_len': 6, 'window': 0}], make_case=make_case, submission=submission, reference=reference)

