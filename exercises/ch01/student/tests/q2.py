from otter.test_files import test_case

OK_FORMAT = False

name = "q2"
points = [0]

@test_case(points=None, hidden=False)
def test_q2_public(DecoderLayer):
    import torch
    from torch import nn
    from xfam_lib.grading import check_cases, compare_outputs
    from xfam_lib.testing import copy_from_torch_layer

    def make_case(p):
        norm_first, b, t, s, d, h, d_ff = p
        ref = nn.TransformerDecoderLayer(d, h, d_ff, dropout=0.0, batch_first=True, norm_first=norm_first, dtype=torch.float64)
        x = torch.randn(b, t, d, dtype=torch.float64)
        x_changed = torch.cat([x[:, :t // 2], torch.randn(b, t - t // 2, d, dtype=torch.float64)], dim=1)
        return {'p': p, 'ref': ref, 'x': x, 'x_changed': x_changed, 'cut': t // 2, 'memory': torch.randn(b, s, d, dtype=torch.float64)}

    def submission(c):
        norm_first, b, t, s, d, h, d_ff = c['p']
        layer = DecoderLayer(d, h, d_ff, norm_first=norm_first).double()
        copy_from_torch_layer(layer, c['ref'])
        return {'out': layer(c['x'], c['memory']), 'out_changed_future': layer(c['x_changed'], c['memory'])}

    def reference(c):
        causal = nn.Transformer.generate_square_subsequent_mask(c['x'].shape[1], dtype=torch.float64)
        return {'out': c['ref'](c['x'], c['memory'], tgt_mask=causal), 'out_changed_future': c['ref'](c['x_changed'], c['memory'], tgt_mask=causal)}

    def compare(c, got, expected):
        a, b, cut = (got.get('out'), got.get('out_changed_future'), c['cut'])
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and (a.shape == b.shape) and (a.dim() == 3) and (cut > 0) and bool(torch.isfinite(a).all()) and bool(torch.isfinite(b).all()):
            moved = float((a[:, :cut] - b[:, :cut]).abs().max())
            assert moved <= 1e-10, f'not causal: changing the decoder input at positions >= {cut} moved the outputs at earlier positions by up to {moved:.3g} (expected 0)'
        compare_outputs(got, expected)
    check_cases('small layer', params=[(False, 2, 4, 3, 8, 2, 16), (True, 2, 4, 3, 8, 2, 16)], make_case=make_case, submission=submission, reference=reference, compare=compare, isolated=False)

