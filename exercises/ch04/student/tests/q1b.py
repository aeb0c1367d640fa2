from otter.test_files import test_case

OK_FORMAT = False

name = "q1b"
points = [0]

@test_case(points=None, hidden=False)
def test_q1b_public(shift_matrix):
    import math
    import torch
    from xfam_grading import check_cases

    def table(length, d, base):
        """The formula in float64: PE[p, 2i] = sin(p base^(-2i/d)), PE[p, 2i+1] = cos(...)."""
        theta = torch.tensor([base ** (-2 * i / d) for i in range(d // 2)], dtype=torch.float64)
        angles = torch.outer(torch.arange(length, dtype=torch.float64), theta)
        return torch.stack((torch.sin(angles), torch.cos(angles)), dim=-1).flatten(1)

    def make_case(p):
        d, base, delta = (p['d_model'], p['base'], p['delta'])
        start = max(0, -delta)
        full = table(start + p['rows'] + max(delta, 0), d, base)
        return {'delta': delta, 'd_model': d, 'base': base, 'PE(p)': full[start:start + p['rows']], 'PE(p + delta)': full[start + delta:start + delta + p['rows']]}

    def submission(c):
        M = shift_matrix(c['delta'], c['d_model'], c['base'])
        return {'shift_matrix': M, 'M @ PE(p)': c['PE(p)'] @ M.T}

    def reference(c):
        M = torch.zeros(c['d_model'], c['d_model'], dtype=torch.float64)
        for i in range(c['d_model'] // 2):
            b = c['delta'] * c['base'] ** (-2 * i / c['d_model'])
            M[2 * i:2 * i + 2, 2 * i:2 * i + 2] = torch.tensor([[math.cos(b), math.sin(b)], [-math.sin(b), math.cos(b)]], dtype=torch.float64)
        return {'shift_matrix': M, 'M @ PE(p)': c['PE(p + delta)']}
    check_cases('shifts', params=[{'rows': 6, 'd_model': 8, 'base': 10000.0, 'delta': 2}, {'rows': 5, 'd_model': 6, 'base': 10000.0, 'delta': -3}], make_case=make_case, submission=submission, reference=reference)

