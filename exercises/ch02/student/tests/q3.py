from otter.test_files import test_case

OK_FORMAT = False

name = "q3"
points = [0]

@test_case(points=None, hidden=False)
def test_q3_public(mha_loop, mha_reshape):
    import torch
    from torch import nn
    from xfam_lib.grading import check_cases

    def make_case(p):
        b, length, d, heads = p
        ref = nn.MultiheadAttention(d, heads, batch_first=True, dtype=torch.float64).eval()
        with torch.no_grad():
            ref.in_proj_bias.normal_()
        return {'heads': heads, 'ref': ref, 'x': torch.randn(b, length, d, dtype=torch.float64)}

    def weights(ref):
        d = ref.embed_dim
        w, bias = (ref.in_proj_weight.detach(), ref.in_proj_bias.detach())
        return (w[:d].T, w[d:2 * d].T, w[2 * d:].T, ref.out_proj.weight.detach().T, bias[:d], bias[d:2 * d], bias[2 * d:], ref.out_proj.bias.detach())

    def submission(c):
        args = (c['x'], *weights(c['ref']), c['heads'])
        return {'mha_loop': mha_loop(*args), 'mha_reshape': mha_reshape(*args)}

    def reference(c):
        out = c['ref'](c['x'], c['x'], c['x'], need_weights=False)[0].detach()
        return {'mha_loop': out, 'mha_reshape': out}
    check_cases('small layer', params=[(2, 5, 8, 2)], make_case=make_case, submission=submission, reference=reference, isolated=False)

