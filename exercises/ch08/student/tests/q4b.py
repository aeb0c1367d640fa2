from otter.test_files import test_case

OK_FORMAT = False

name = "q4b"
points = [0]

@test_case(points=None, hidden=False)
def test_q4b_public(gla_parallel):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        shape = tuple(p['leading dims']) + (p['L'],)
        low, high = p['log gate range']
        return {'q': torch.randn(*shape, p['d_k'], dtype=torch.float64), 'k': torch.randn(*shape, p['d_k'], dtype=torch.float64), 'v': torch.randn(*shape, p['d_v'], dtype=torch.float64), 'log_g': low + (high - low) * torch.rand(*shape, p['d_k'], dtype=torch.float64)}

    def submission(c):
        return gla_parallel(c['q'], c['k'], c['v'], c['log_g'])

    def reference(c):
        from xfam_lib.linear import gated_linear_attention
        return gated_linear_attention(c['q'], c['k'], c['v'], c['log_g'], mode='recurrent')
    check_cases('sequences', params=[{'leading dims': (2,), 'L': 6, 'd_k': 3, 'd_v': 2, 'log gate range': (-0.5, 0.0)}, {'leading dims': (1, 2), 'L': 5, 'd_k': 4, 'd_v': 4, 'log gate range': (-1.0, -0.1)}, {'leading dims': (), 'L': 300, 'd_k': 2, 'd_v': 3, 'log gate range': (-4.0, -2.0)}], make_case=make_case, submission=submission, reference=reference)

