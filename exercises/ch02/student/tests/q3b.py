from otter.test_files import test_case

OK_FORMAT = False

name = "q3b"
points = [0]

@test_case(points=None, hidden=False)
def test_q3b_public(mha_reshape):
    import torch
    from torch import nn
    from xfam_grading import check_cases

    def make_case(p):
        d, heads, length = (p['d'], p['heads'], p['L'])
        ref = nn.MultiheadAttention(d, heads, batch_first=True, dtype=torch.float64)
        with torch.no_grad():
            ref.in_proj_bias.normal_()
            ref.out_proj.bias.normal_()
        w, b = (ref.in_proj_weight.detach(), ref.in_proj_bias.detach())
        mask = torch.ones(length, length, dtype=torch.bool).tril() if p['mask'] == 'causal' else None
        return {'x': torch.randn(p['B'], length, d, dtype=torch.float64), 'heads': heads, 'mask': mask, 'weights': (w[:d].T, w[d:2 * d].T, w[2 * d:].T, ref.out_proj.weight.detach().T, b[:d], b[d:2 * d], b[2 * d:], ref.out_proj.bias.detach()), 'torch layer': ref.state_dict()}

    def submission(c):
        return mha_reshape(c['x'], *c['weights'], c['heads'], mask=c['mask'])

    def reference(c):
        d, heads = (c['x'].shape[-1], c['heads'])
        ref = nn.MultiheadAttention(d, heads, batch_first=True, dtype=torch.float64).eval()
        ref.load_state_dict(c['torch layer'])
        mask = None if c['mask'] is None else ~c['mask']
        return ref(c['x'], c['x'], c['x'], attn_mask=mask, need_weights=False)[0].detach()
    check_cases('small layer', params=[{'B': 2, 'L': 5, 'd': 8, 'heads': 2, 'mask': None}, {'B': 2, 'L': 5, 'd': 8, 'heads': 2, 'mask': 'causal'}, {'B': 1, 'L': 4, 'd': 12, 'heads': 3, 'mask': 'causal'}], make_case=make_case, submission=submission, reference=reference)

