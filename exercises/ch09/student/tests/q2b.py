from otter.test_files import test_case

OK_FORMAT = False

name = "q2b"
points = [0]

@test_case(points=None, hidden=False)
def test_q2b_public(causal_conv_fft):
    import math
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        n, length = (p['N'], p['L'])
        A_bar = 0.9 * torch.linalg.qr(torch.randn(n, n, dtype=torch.float64)).Q
        B_bar, C = (torch.randn(n, dtype=torch.float64), torch.randn(n, dtype=torch.float64))
        K = torch.stack([C @ torch.linalg.matrix_power(A_bar, i) @ B_bar for i in range(length)])
        u = torch.randn(*p['batch'], length, dtype=torch.float64)
        return {'u': u, 'K': K, 'A_bar': A_bar, 'B_bar': B_bar, 'C': C}

    def submission(c):
        return causal_conv_fft(c['u'], c['K'])

    def reference(c):
        from xfam_lib.ssm import ssm_recurrence
        return ssm_recurrence(c['A_bar'], c['B_bar'], c['C'], c['u'])
    check_cases('conv = recurrence', params=[{'batch': (), 'N': 3, 'L': 8}, {'batch': (2,), 'N': 2, 'L': 7}, {'batch': (2, 3), 'N': 4, 'L': 16}], make_case=make_case, submission=submission, reference=reference)

