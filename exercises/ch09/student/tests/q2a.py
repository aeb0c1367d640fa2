from otter.test_files import test_case

OK_FORMAT = False

name = "q2a"
points = [0]

@test_case(points=None, hidden=False)
def test_q2a_public(ssm_kernel_loop):
    import math
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        n = p['N']
        A_bar = p['radius'] * torch.linalg.qr(torch.randn(n, n, dtype=torch.float64)).Q
        A_bar = A_bar + 0.2 * torch.randn(n, n, dtype=torch.float64) / math.sqrt(n)
        return {'A_bar': A_bar, 'B_bar': torch.randn(n, dtype=torch.float64), 'C': torch.randn(n, dtype=torch.float64), 'L': p['L']}

    def submission(c):
        return ssm_kernel_loop(c['A_bar'], c['B_bar'], c['C'], c['L'])

    def reference(c):
        from xfam_lib.ssm import ssm_recurrence
        impulse = torch.zeros(c['L'], dtype=torch.float64)
        impulse[0] = 1.0
        return ssm_recurrence(c['A_bar'], c['B_bar'], c['C'], impulse)
    check_cases('kernels', params=[{'N': 3, 'L': 8, 'radius': 0.9}, {'N': 2, 'L': 1, 'radius': 0.5}, {'N': 4, 'L': 20, 'radius': 0.8}], make_case=make_case, submission=submission, reference=reference)

