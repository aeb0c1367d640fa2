from otter.test_files import test_case

OK_FORMAT = False

name = "q2"
points = [0]

@test_case(points=None, hidden=False)
def test_q2_public(DecoderLayer):
    import torch
    from torch import nn
    from xfam_grading import check_cases, output_problems

    def make_case(p):
        d, h, d_ff, t = (p['d'], p['heads'], p['d_ff'], p['T'])
        ref = nn.TransformerDecoderLayer(d, h, d_ff, dropout=0.0, batch_first=True, norm_first=p['norm_first'], dtype=torch.float64)
        with torch.no_grad():
            for vector in (t for t in ref.parameters() if t.dim() == 1):
                vector.normal_()
        lengths = p['memory lengths']
        b, s = (len(lengths), max(lengths))
        x = torch.randn(b, t, d, dtype=torch.float64)
        cut = p.get('changed from', t // 2)
        x_changed = torch.cat([x[:, :cut], 10 * torch.randn(b, t - cut, d, dtype=torch.float64)], dim=1)
        return {'d': d, 'heads': h, 'd_ff': d_ff, 'norm_first': p['norm_first'], 'torch layer': ref.state_dict(), 'x': x, 'x changed': x_changed, 'cut': cut, 'memory': torch.randn(b, s, d, dtype=torch.float64), 'valid': torch.arange(s) < torch.tensor(lengths)[:, None], 'padded': min(lengths) < s}

    def submission(c):
        import torch
        from torch import nn
        from xfam_lib.testing import copy_from_torch_layer
        ref = nn.TransformerDecoderLayer(c['d'], c['heads'], c['d_ff'], dropout=0.0, batch_first=True, norm_first=c['norm_first'], dtype=torch.float64)
        ref.load_state_dict(c['torch layer'])
        layer = DecoderLayer(c['d'], c['heads'], c['d_ff'], norm_first=c['norm_first']).double()
        copy_from_torch_layer(layer, ref)
        mask = c['valid'][:, None, None, :] if c['padded'] else None
        return {'out': layer(c['x'], c['memory'], memory_mask=mask), 'out, later positions changed': layer(c['x changed'], c['memory'], memory_mask=mask)}

    def reference(c):
        ref = nn.TransformerDecoderLayer(c['d'], c['heads'], c['d_ff'], dropout=0.0, batch_first=True, norm_first=c['norm_first'], dtype=torch.float64).eval()
        ref.load_state_dict(c['torch layer'])
        causal = nn.Transformer.generate_square_subsequent_mask(c['x'].shape[1], dtype=torch.float64)
        padding = ~c['valid'] if c['padded'] else None
        with torch.no_grad():
            return {name: ref(x, c['memory'], tgt_mask=causal, memory_key_padding_mask=padding) for name, x in (('out', c['x']), ('out, later positions changed', c['x changed']))}

    def compare(c, got, expected):
        problems = []
        a, b, cut = (got.get('out'), got.get('out, later positions changed'), c['cut']) if isinstance(got, dict) else (None, None, 0)
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and (a.shape == b.shape) and (a.dim() == 3) and (cut > 0) and bool(torch.isfinite(a).all()) and bool(torch.isfinite(b).all()):
            moved = float((a[:, :cut] - b[:, :cut]).abs().max())
            if not moved <= 1e-10:
                problems.append(f'not causal: changing the decoder input at positions >= {cut} moved the outputs at earlier positions by up to {moved:.3g} (expected 0)')
        problems += output_problems(got, expected)
        if problems:
            raise AssertionError('; '.join(problems))
    check_cases('small layer', params=[{'norm_first': False, 'T': 4, 'memory lengths': (3, 3), 'd': 8, 'heads': 2, 'd_ff': 16}, {'norm_first': True, 'T': 4, 'memory lengths': (3, 3), 'd': 8, 'heads': 2, 'd_ff': 16}, {'norm_first': False, 'T': 3, 'memory lengths': (4, 2), 'd': 8, 'heads': 2, 'd_ff': 16}], make_case=make_case, submission=submission, reference=reference, compare=compare)

