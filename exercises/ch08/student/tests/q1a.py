from otter.test_files import test_case

OK_FORMAT = False

name = "q1a"
points = [0]

@test_case(points=None, hidden=False)
def test_q1a_public(linear_attention_recurrent):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        shape = tuple(p['leading dims']) + (p['L'],)
        return {'q': torch.randn(*shape, p['d_k'], dtype=torch.float64), 'k': torch.randn(*shape, p['d_k'], dtype=torch.float64), 'v': torch.randn(*shape, p['d_v'], dtype=torch.float64), 'eps': p['eps']}

    def submission(c):
        out, S, z = linear_attention_recurrent(c['q'], c['k'], c['v'], c['eps'])
        return {'out': out, 'S': S, 'z': z}

    def reference(c):
        import torch.nn.functional as F
        from xfam_lib.linear import linear_attention
        fk = F.elu(c['k']) + 1
        return {'out': linear_attention(c['q'], c['k'], c['v'], causal=True, mode='parallel', eps=c['eps']), 'S': fk.transpose(-2, -1) @ c['v'], 'z': fk.sum(-2)}
    check_cases('small sequences', params=[{'leading dims': (2, 3), 'L': 5, 'd_k': 4, 'd_v': 3, 'eps': 1e-06}, {'leading dims': (1,), 'L': 6, 'd_k': 2, 'd_v': 5, 'eps': 1.0}, {'leading dims': (), 'L': 4, 'd_k': 3, 'd_v': 3, 'eps': 1e-06}], make_case=make_case, submission=submission, reference=reference)

