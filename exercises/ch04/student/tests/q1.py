from otter.test_files import test_case

OK_FORMAT = False

name = "q1"
points = [0]

@test_case(points=None, hidden=False)
def test_q1_public(sinusoidal_pe, shift_matrix):
    import math
    import torch
    from xfam_lib.grading import check_cases

    def table(length, d, base):
        """The formula entry by entry, in float64."""
        pe = torch.zeros(length, d, dtype=torch.float64)
        for p in range(length):
            for i in range(d // 2):
                pe[p, 2 * i] = math.sin(p * base ** (-2 * i / d))
                pe[p, 2 * i + 1] = math.cos(p * base ** (-2 * i / d))
        return pe

    def make_case(p):
        length, d, base, delta = p
        return {'length': length, 'd': d, 'base': base, 'delta': delta}

    def submission(c):
        pe = table(c['length'] + abs(c['delta']), c['d'], c['base'])
        start = abs(c['delta']) if c['delta'] < 0 else 0
        rows = pe[start:start + c['length']]
        M = shift_matrix(c['delta'], c['d'], c['base'])
        return {'sinusoidal_pe': sinusoidal_pe(c['length'], c['d'], c['base']), 'shift_matrix': M, 'M @ PE(p), p = rows': rows @ M.T}

    def reference(c):
        pe = table(c['length'] + abs(c['delta']), c['d'], c['base'])
        start = abs(c['delta']) if c['delta'] < 0 else 0
        M = torch.zeros(c['d'], c['d'], dtype=torch.float64)
        for i in range(c['d'] // 2):
            b = c['delta'] * c['base'] ** (-2 * i / c['d'])
            M[2 * i:2 * i + 2, 2 * i:2 * i + 2] = torch.tensor([[math.cos(b), math.sin(b)], [-math.sin(b), math.cos(b)]], dtype=torch.float64)
        return {'sinusoidal_pe': table(c['length'], c['d'], c['base']).float(), 'shift_matrix': M, 'M @ PE(p), p = rows': pe[start + c['delta']:start + c['delta'] + c['length']]}
    check_cases('small table', params=[(6, 8, 10000.0, 2)], make_case=make_case, submission=submission, reference=reference, isolated=False)

