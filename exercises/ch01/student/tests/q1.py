from otter.test_files import test_case

OK_FORMAT = False

name = "q1"
points = [0]

@test_case(points=None, hidden=False)
def test_q1_public(EncoderLayer, encoder_layer_param_count):
    import torch
    from torch import nn
    from xfam_lib.grading import check_cases
    from xfam_lib.testing import copy_from_torch_layer

    def make_case(p):
        norm_first, b, length, d, h, d_ff = p
        ref = nn.TransformerEncoderLayer(d, h, d_ff, dropout=0.0, batch_first=True, norm_first=norm_first, dtype=torch.float64)
        return {'p': p, 'ref': ref, 'x': torch.randn(b, length, d, dtype=torch.float64)}

    def submission(c):
        norm_first, b, length, d, h, d_ff = c['p']
        layer = EncoderLayer(d, h, d_ff, norm_first=norm_first).double()
        copy_from_torch_layer(layer, c['ref'])
        return {'out': layer(c['x']), 'param_count': encoder_layer_param_count(d, d_ff)}

    def reference(c):
        return {'out': c['ref'](c['x']), 'param_count': sum((t.numel() for t in c['ref'].parameters()))}
    check_cases('small layer', params=[(False, 2, 5, 8, 2, 16), (True, 2, 5, 8, 2, 16)], make_case=make_case, submission=submission, reference=reference, isolated=False)

