from otter.test_files import test_case

OK_FORMAT = False

name = "q3a"
points = [0]

@test_case(points=None, hidden=False)
def test_q3a_public(selective_scan_loop):
    import torch
    import torch.nn.functional as F
    from xfam_grading import check_cases

    def make_case(p):
        b, d, n, length = (p['batch'], p['d'], p['N'], p['L'])
        return {'u': torch.randn(b, d, length, dtype=torch.float64), 'delta': F.softplus(torch.randn(b, d, length, dtype=torch.float64) - 1.0), 'A': -torch.exp(torch.randn(d, n, dtype=torch.float64)), 'B': torch.randn(b, n, length, dtype=torch.float64), 'C': torch.randn(b, n, length, dtype=torch.float64), 'D': torch.randn(d, dtype=torch.float64), 'z': torch.randn(b, d, length, dtype=torch.float64), 'use D and z': p['D and z']}

    def submission(c):
        extras = (c['D'], c['z']) if c['use D and z'] else (None, None)
        y, last = selective_scan_loop(c['u'], c['delta'], c['A'], c['B'], c['C'], *extras)
        return {'y': y, 'last_state': last}

    def reference(c):
        from xfam_lib.ssm import selective_scan
        extras = (c['D'], c['z']) if c['use D and z'] else (None, None)
        y, last = selective_scan(c['u'], c['delta'], c['A'], c['B'], c['C'], *extras, return_last_state=True)
        return {'y': y, 'last_state': last}
    check_cases('selective scan', params=[{'batch': 1, 'd': 2, 'N': 3, 'L': 6, 'D and z': False}, {'batch': 2, 'd': 3, 'N': 4, 'L': 5, 'D and z': True}, {'batch': 2, 'd': 1, 'N': 2, 'L': 1, 'D and z': True}], make_case=make_case, submission=submission, reference=reference)

