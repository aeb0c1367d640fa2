from otter.test_files import test_case

OK_FORMAT = False

name = "q5a"
points = [0]

@test_case(points=None, hidden=False)
def test_q5a_public(linformer):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        lead, L, d, r = (tuple(p['leading dims']), p['L'], p['d'], p['r'])
        E = torch.randn(r, L, dtype=torch.float64) / L ** 0.5
        F = E if p['shared'] else torch.randn(r, L, dtype=torch.float64) / L ** 0.5
        return {'q': torch.randn(*lead, L, d, dtype=torch.float64), 'k': torch.randn(*lead, L, d, dtype=torch.float64), 'v': torch.randn(*lead, L, p['d_v'], dtype=torch.float64), 'E': E, 'F': F}

    def submission(c):
        return linformer(c['q'], c['k'], c['v'], c['E'], c['F'])

    def reference(c):
        from xfam_lib.linear import linformer_attention
        return linformer_attention(c['q'], c['k'], c['v'], c['E'], c['F'])
    check_cases('small projections', params=[{'leading dims': (2,), 'L': 8, 'd': 4, 'd_v': 3, 'r': 3, 'shared': True}, {'leading dims': (), 'L': 6, 'd': 5, 'd_v': 2, 'r': 6, 'shared': False}, {'leading dims': (2, 2), 'L': 10, 'd': 3, 'd_v': 4, 'r': 4, 'shared': False}], make_case=make_case, submission=submission, reference=reference)

