from otter.test_files import test_case

OK_FORMAT = False

name = "q1b"
points = [0]

@test_case(points=None, hidden=False)
def test_q1b_public(linear_attention_chunk):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        shape = tuple(p['leading dims']) + (p['L'],)
        return {'q': torch.randn(*shape, p['d_k'], dtype=torch.float64), 'k': torch.randn(*shape, p['d_k'], dtype=torch.float64), 'v': torch.randn(*shape, p['d_v'], dtype=torch.float64), 'chunk_size': p['chunk_size'], 'eps': p['eps']}

    def submission(c):
        out, S_in = linear_attention_chunk(c['q'], c['k'], c['v'], c['chunk_size'], c['eps'])
        return {'out': out, 'S_in': S_in}

    def reference(c):
        import torch.nn.functional as F
        from xfam_lib.linear import linear_attention
        fk, v, size = (F.elu(c['k']) + 1, c['v'], c['chunk_size'])
        starts = range(0, v.shape[-2], size)
        S_in = torch.stack([fk[..., :s, :].transpose(-2, -1) @ v[..., :s, :] for s in starts], dim=-3)
        return {'out': linear_attention(c['q'], c['k'], v, causal=True, mode='parallel', eps=c['eps']), 'S_in': S_in}
    check_cases('small sequences', params=[{'leading dims': (2,), 'L': 8, 'd_k': 3, 'd_v': 2, 'chunk_size': 4, 'eps': 1e-06}, {'leading dims': (1, 2), 'L': 7, 'd_k': 2, 'd_v': 4, 'chunk_size': 3, 'eps': 1.0}, {'leading dims': (), 'L': 5, 'd_k': 3, 'd_v': 3, 'chunk_size': 1, 'eps': 1e-06}, {'leading dims': (2,), 'L': 4, 'd_k': 2, 'd_v': 3, 'chunk_size': 6, 'eps': 1e-06}], make_case=make_case, submission=submission, reference=reference)

