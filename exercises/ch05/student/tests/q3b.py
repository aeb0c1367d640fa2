from otter.test_files import test_case

OK_FORMAT = False

name = "q3b"
points = [0]

@test_case(points=None, hidden=False)
def test_q3b_public(knn_lm_mix):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        shape = tuple(p['shape'])
        return {'p_lm': torch.softmax(torch.randn(*shape, dtype=torch.float64), -1), 'p_knn': torch.softmax(3 * torch.randn(*shape, dtype=torch.float64), -1), 'lam': p['lam']}

    def submission(c):
        return knn_lm_mix(c['p_lm'], c['p_knn'], c['lam'])

    def reference(c):
        from xfam_lib.memory import knn_lm_interpolate
        return knn_lm_interpolate(c['p_lm'], c['p_knn'], c['lam'])
    check_cases('mixtures', params=[{'shape': (2, 5), 'lam': 0.25}, {'shape': (3, 4), 'lam': 0.0}, {'shape': (4,), 'lam': 1.0}], make_case=make_case, submission=submission, reference=reference)

