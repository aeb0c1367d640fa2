from otter.test_files import test_case

OK_FORMAT = False

name = "q2a"
points = [0]

@test_case(points=None, hidden=False)
def test_q2a_public(band_mask):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        return dict(p)

    def submission(c):
        return band_mask(c['L'], c['window'], c['causal'])

    def reference(c):
        from xfam_lib.sparse import sliding_window_mask
        return sliding_window_mask(c['L'], c['window'], c['causal'])
    check_cases('small bands', params=[{'L': 8, 'window': 2, 'causal': False}, {'L': 8, 'window': 2, 'causal': True}, {'L': 16, 'window': 3, 'causal': True}, {'L': 5, 'window': 0, 'causal': False}], make_case=make_case, submission=submission, reference=reference)

