from otter.test_files import test_case

OK_FORMAT = False

name = "q3b"
points = [0]

@test_case(points=None, hidden=False)
def test_q3b_public(best_state_recall_error):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        lead = tuple(p['leading dims'])
        return {'keys': torch.randn(*lead, p['n'], p['d_k'], dtype=torch.float64), 'values': torch.randn(*lead, p['n'], p['d_v'], dtype=torch.float64)}

    def submission(c):
        return best_state_recall_error(c['keys'], c['values'])

    def reference(c):
        K, V = (c['keys'], c['values'])
        residual = K @ (torch.linalg.pinv(K) @ V) - V
        return residual.flatten(-2).norm(dim=-1) / V.flatten(-2).norm(dim=-1)
    check_cases('small memories', params=[{'leading dims': (3,), 'n': 3, 'd_k': 6, 'd_v': 2}, {'leading dims': (2,), 'n': 10, 'd_k': 4, 'd_v': 3}, {'leading dims': (), 'n': 5, 'd_k': 5, 'd_v': 4}], make_case=make_case, submission=submission, reference=reference)

