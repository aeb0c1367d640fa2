from otter.test_files import test_case

OK_FORMAT = False

name = "q2b"
points = [0]

@test_case(points=None, hidden=False)
def test_q2b_public(PooledReadout):
    import torch
    from xfam_lib.attention import MultiHeadAttention
    from xfam_grading import check_cases

    def make_case(p):
        attn = MultiHeadAttention(p['d'], 2).double()
        return {'d': p['d'], 'attn': attn.state_dict(), 'perm': torch.randperm(p['L']), 'x': torch.randn(p['B'], p['L'], p['d'], dtype=torch.float64)}

    def submission(c):
        import torch
        from xfam_lib.attention import MultiHeadAttention
        attn = MultiHeadAttention(c['d'], 2).double().eval()
        attn.load_state_dict(c['attn'])
        readout = PooledReadout(attn)
        with torch.no_grad():
            return {'readout': readout(c['x']), 'readout of shuffled x': readout(c['x'][:, c['perm']])}

    def reference(c):
        attn = MultiHeadAttention(c['d'], 2).double().eval()
        attn.load_state_dict(c['attn'])
        with torch.no_grad():
            pooled = attn(c['x']).mean(1)
        return {'readout': pooled, 'readout of shuffled x': pooled}
    check_cases('one attention layer', params=[{'B': 2, 'L': 5, 'd': 8}], make_case=make_case, submission=submission, reference=reference)

