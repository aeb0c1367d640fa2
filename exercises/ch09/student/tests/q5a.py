from otter.test_files import test_case

OK_FORMAT = False

name = "q5a"
points = [0]

@test_case(points=None, hidden=False)
def test_q5a_public(ssd_attention):
    import torch
    import torch.nn.functional as F
    from xfam_grading import check_cases

    def make_case(p):
        b, length, h, n, d = (p['batch'], p['L'], p['H'], p['N'], p['P'])
        if p['decay'] == 'strong':
            a = -40.0 - 20.0 * torch.rand(b, length, h, dtype=torch.float64)
        else:
            a = -F.softplus(torch.randn(b, length, h, dtype=torch.float64))
        return {'x': torch.randn(b, length, h, d, dtype=torch.float64), 'a': a, 'B': torch.randn(b, length, h, n, dtype=torch.float64), 'C': torch.randn(b, length, h, n, dtype=torch.float64)}

    def submission(c):
        return ssd_attention(c['x'], c['a'], c['B'], c['C'])

    def reference(c):
        from xfam_lib.ssm import ssd_scan
        return ssd_scan(c['x'], c['a'], c['B'], c['C'])
    check_cases('attention form = scan', params=[{'batch': 1, 'L': 6, 'H': 2, 'N': 3, 'P': 4, 'decay': 'mild'}, {'batch': 2, 'L': 5, 'H': 3, 'N': 2, 'P': 2, 'decay': 'mild'}, {'batch': 1, 'L': 32, 'H': 2, 'N': 4, 'P': 3, 'decay': 'strong'}], make_case=make_case, submission=submission, reference=reference)

