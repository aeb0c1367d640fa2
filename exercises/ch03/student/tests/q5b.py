from otter.test_files import test_case

OK_FORMAT = False

name = "q5b"
points = [0]

@test_case(points=None, hidden=False)
def test_q5b_public(gqa_attention):
    import torch
    import torch.nn.functional as F
    from xfam_grading import check_cases

    def make_case(p):
        b, h, h_kv, lq, lk = (p['B'], p['heads'], p['kv heads'], p['Lq'], p['Lk'])
        return {'causal': p['causal'], 'q': torch.randn(b, h, lq, 8, dtype=torch.float64), 'k': torch.randn(b, h_kv, lk, 8, dtype=torch.float64), 'v': torch.randn(b, h_kv, lk, 8, dtype=torch.float64)}

    def submission(c):
        return gqa_attention(c['q'], c['k'], c['v'], causal=c['causal'])

    def reference(c):
        q, k, v = (c['q'], c['k'], c['v'])
        mask = None
        if c['causal']:
            lq, lk = (q.shape[-2], k.shape[-2])
            mask = torch.arange(lk) <= torch.arange(lq).unsqueeze(-1) + (lk - lq)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    check_cases('small', params=[{'B': 1, 'heads': 4, 'kv heads': 2, 'Lq': 3, 'Lk': 3, 'causal': False}, {'B': 1, 'heads': 4, 'kv heads': 2, 'Lq': 3, 'Lk': 5, 'causal': True}], make_case=make_case, submission=submission, reference=reference)

