from otter.test_files import test_case

OK_FORMAT = False

name = "q2a"
points = [0]

@test_case(points=None, hidden=False)
def test_q2a_public(reordered_block):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        from torch import nn
        from xfam_lib.attention import MultiHeadAttention
        from xfam_lib.transformer import FeedForward
        d = p['d']
        norms = [nn.LayerNorm(d).double() for _ in range(2)]
        for norm in norms:
            with torch.no_grad():
                norm.weight.copy_(1 + 0.5 * torch.randn(d, dtype=torch.float64))
                norm.bias.copy_(0.5 * torch.randn(d, dtype=torch.float64))
        return {'d': d, 'heads': p['heads'], 'd_ff': p['d_ff'], 'relu': p['relu'], 'attn': MultiHeadAttention(d, p['heads']).double().state_dict(), 'ff': FeedForward(d, p['d_ff']).double().state_dict(), 'norm1': norms[0].state_dict(), 'norm2': norms[1].state_dict(), 'x': p['x scale'] * torch.randn(p['B'], p['L'], d, dtype=torch.float64)}

    def submission(c):
        import torch
        from torch import nn
        from xfam_lib.attention import MultiHeadAttention
        from xfam_lib.transformer import FeedForward
        attn = MultiHeadAttention(c['d'], c['heads']).double().eval()
        attn.load_state_dict(c['attn'])
        ff = FeedForward(c['d'], c['d_ff']).double().eval()
        ff.load_state_dict(c['ff'])
        norm1, norm2 = (nn.LayerNorm(c['d']).double(), nn.LayerNorm(c['d']).double())
        norm1.load_state_dict(c['norm1'])
        norm2.load_state_dict(c['norm2'])
        with torch.no_grad():
            return reordered_block(c['x'], attn, ff, norm1, norm2, relu=c['relu'])

    def reference(c):
        from xfam_lib.attention import causal_mask
        from xfam_lib.rl import GTrXLBlock
        from xfam_lib.transformer import EncoderLayer
        if c['relu']:
            block = GTrXLBlock(c['d'], c['heads'], c['d_ff'], gate='residual', relu=True).double().eval()
            attn, ff = (block.attn, block.ff)
        else:
            block = EncoderLayer(c['d'], c['heads'], c['d_ff'], norm_first=True).double().eval()
            attn, ff = (block.self_attn, block.ff)
        attn.load_state_dict(c['attn'])
        ff.load_state_dict(c['ff'])
        block.norm1.load_state_dict(c['norm1'])
        block.norm2.load_state_dict(c['norm2'])
        with torch.no_grad():
            if c['relu']:
                return block(c['x'])
            return block(c['x'], mask=causal_mask(c['x'].shape[1]))

    def compare(c, got, expected):
        from xfam_grading import output_problems
        problems = output_problems(got, expected)
        if problems:
            raise AssertionError('; '.join(problems + mistakes(c, got)))

    def mistakes(c, got):
        """The known mistakes whose output the answer reproduces."""
        from torch import nn
        from xfam_lib.attention import MultiHeadAttention
        from xfam_lib.transformer import FeedForward
        if not isinstance(got, torch.Tensor) or got.shape != c['x'].shape:
            return []
        attn = MultiHeadAttention(c['d'], c['heads']).double().eval()
        attn.load_state_dict(c['attn'])
        ff = FeedForward(c['d'], c['d_ff']).double().eval()
        ff.load_state_dict(c['ff'])
        norm1, norm2 = (nn.LayerNorm(c['d']).double(), nn.LayerNorm(c['d']).double())
        norm1.load_state_dict(c['norm1'])
        norm2.load_state_dict(c['norm2'])

        def post_ln():
            with torch.no_grad():
                x = norm1(c['x'] + attn(c['x'], causal=True))
                return norm2(x + ff(x))

        def not_causal():
            from xfam_lib.transformer import EncoderLayer
            block = EncoderLayer(c['d'], c['heads'], c['d_ff'], norm_first=True).double().eval()
            block.self_attn.load_state_dict(c['attn'])
            block.ff.load_state_dict(c['ff'])
            block.norm1.load_state_dict(c['norm1'])
            block.norm2.load_state_dict(c['norm2'])
            with torch.no_grad():
                return block(c['x'])
        named = [('this is the Post-LN layer (LayerNorm after each residual sum); the reordering puts the LayerNorm on the branch input only: x + sublayer(LN(x))', post_ln)]
        if not c['relu']:
            named.append(('the attention is not causal: pass causal=True, so that a position sees no later one', not_causal))
        return [why for why, mistake in named if torch.allclose(got, mistake(), atol=1e-08)]
    check_cases('small layers', params=[{'B': 2, 'L': 5, 'd': 8, 'heads': 2, 'd_ff': 16, 'relu': False, 'x scale': 1.0}, {'B': 1, 'L': 6, 'd': 6, 'heads': 3, 'd_ff': 12, 'relu': True, 'x scale': 1.0}], make_case=make_case, submission=submission, reference=reference, compare=compare)

