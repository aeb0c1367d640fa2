from otter.test_files import test_case

OK_FORMAT = False

name = "q1a"
points = [0]

@test_case(points=None, hidden=False)
def test_q1a_public(EncoderLayer):
    import torch
    from torch import nn
    from xfam_grading import check_cases

    def make_case(p):
        d, h, d_ff = (p['d'], p['heads'], p['d_ff'])
        ref = nn.TransformerEncoderLayer(d, h, d_ff, dropout=0.0, batch_first=True, norm_first=p['norm_first'], dtype=torch.float64)
        with torch.no_grad():
            for vector in (t for t in ref.parameters() if t.dim() == 1):
                vector.normal_()
        lengths = p.get('valid lengths')
        b, length = (len(lengths), max(lengths)) if lengths else (p['B'], p['L'])
        valid = torch.arange(length) < torch.tensor(lengths or [length] * b)[:, None]
        return {'d': d, 'heads': h, 'd_ff': d_ff, 'norm_first': p['norm_first'], 'torch layer': ref.state_dict(), 'x': torch.randn(b, length, d, dtype=torch.float64), 'valid': valid, 'padded': bool(lengths)}

    def submission(c):
        import torch
        from torch import nn
        from xfam_lib.testing import copy_from_torch_layer
        ref = nn.TransformerEncoderLayer(c['d'], c['heads'], c['d_ff'], dropout=0.0, batch_first=True, norm_first=c['norm_first'], dtype=torch.float64)
        ref.load_state_dict(c['torch layer'])
        layer = EncoderLayer(c['d'], c['heads'], c['d_ff'], norm_first=c['norm_first']).double()
        copy_from_torch_layer(layer, ref)
        mask = c['valid'][:, None, None, :] if c['padded'] else None
        return layer(c['x'], mask=mask)

    def reference(c):
        ref = nn.TransformerEncoderLayer(c['d'], c['heads'], c['d_ff'], dropout=0.0, batch_first=True, norm_first=c['norm_first'], dtype=torch.float64).eval()
        ref.load_state_dict(c['torch layer'])
        with torch.no_grad():
            return ref(c['x'], src_key_padding_mask=~c['valid'] if c['padded'] else None)
    check_cases('small layer', params=[{'norm_first': False, 'B': 2, 'L': 5, 'd': 8, 'heads': 2, 'd_ff': 16}, {'norm_first': True, 'B': 2, 'L': 5, 'd': 8, 'heads': 2, 'd_ff': 16}, {'norm_first': False, 'valid lengths': (5, 2), 'd': 8, 'heads': 2, 'd_ff': 16}], make_case=make_case, submission=submission, reference=reference)

