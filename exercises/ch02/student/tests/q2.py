from otter.test_files import test_case

OK_FORMAT = False

name = "q2"
points = [0]

@test_case(points=None, hidden=False)
def test_q2_public(equivariance_error, PooledReadout):
    import torch
    from xfam_lib.attention import MultiHeadAttention
    from xfam_lib.grading import check_cases

    def make_case(p):
        b, length, d = p
        attn = MultiHeadAttention(d, 2).double().eval()
        return {'attn': attn, 'x': torch.randn(b, length, d, dtype=torch.float64), 'perm': torch.randperm(length)}

    def submission(c):
        attn, x, perm = (c['attn'], c['x'], c['perm'])
        readout = PooledReadout(attn)
        with torch.no_grad():
            return {'error is tiny': equivariance_error(attn, x, perm) < 1e-12, 'readout': readout(x), 'readout of shuffled x': readout(x[:, perm])}

    def reference(c):
        with torch.no_grad():
            pooled = c['attn'](c['x']).mean(1)
        return {'error is tiny': True, 'readout': pooled, 'readout of shuffled x': pooled}
    check_cases('one attention layer', params=[(2, 5, 8)], make_case=make_case, submission=submission, reference=reference, isolated=False)

