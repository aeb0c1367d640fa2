from otter.test_files import test_case

OK_FORMAT = False

name = "q3a"
points = [0]

@test_case(points=None, hidden=False)
def test_q3a_public(crosstalk_recall_error):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        lead, n, d_k = (tuple(p['leading dims']), p['n'], p['d_k'])
        if p['keys'] == 'orthonormal':
            keys = torch.linalg.qr(torch.randn(*lead, d_k, n, dtype=torch.float64)).Q.transpose(-2, -1)
        else:
            keys = torch.randn(*lead, n, d_k, dtype=torch.float64)
            if p['keys'] == 'unit':
                keys = keys / keys.norm(dim=-1, keepdim=True)
        return {'keys': keys, 'values': torch.randn(*lead, n, p['d_v'], dtype=torch.float64)}

    def submission(c):
        return crosstalk_recall_error(c['keys'], c['values'])

    def reference(c):
        from xfam_lib.linear import recall_error
        return recall_error(c['keys'], c['values'])
    check_cases('small memories', params=[{'leading dims': (3,), 'n': 4, 'd_k': 8, 'd_v': 5, 'keys': 'unit'}, {'leading dims': (2,), 'n': 5, 'd_k': 5, 'd_v': 3, 'keys': 'orthonormal'}, {'leading dims': (), 'n': 12, 'd_k': 4, 'd_v': 4, 'keys': 'gaussian'}], make_case=make_case, submission=submission, reference=reference)

