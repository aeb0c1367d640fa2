from otter.test_files import test_case

OK_FORMAT = False

name = "q2b"
points = [0]

@test_case(points=None, hidden=False)
def test_q2b_public(gated_block):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        from xfam_lib.rl import GTrXLBlock
        block = GTrXLBlock(p['d'], p['heads'], p['d_ff'], gate='gru', bias_init=p['b_g']).double()
        with torch.no_grad():
            for module in (block.norm1, block.norm2):
                module.weight.copy_(1 + 0.5 * torch.randn(p['d'], dtype=torch.float64))
                module.bias.copy_(0.5 * torch.randn(p['d'], dtype=torch.float64))
            for gate in (block.gate1, block.gate2):
                for w in (gate.W.weight, gate.U_rz.weight, gate.U_g.weight):
                    w.mul_(3.0)
        parts = {name: getattr(block, name).state_dict() for name in ('attn', 'ff', 'norm1', 'norm2', 'gate1', 'gate2')}
        return dict(parts, d=p['d'], heads=p['heads'], d_ff=p['d_ff'], b_g=p['b_g'], block=block.state_dict(), x=torch.randn(p['B'], p['L'], p['d'], dtype=torch.float64))

    def submission(c):
        import torch
        from torch import nn
        from xfam_lib.attention import MultiHeadAttention
        from xfam_lib.rl import GRUGate
        from xfam_lib.transformer import FeedForward
        d = c['d']
        modules = {'attn': MultiHeadAttention(d, c['heads']), 'ff': FeedForward(d, c['d_ff']), 'norm1': nn.LayerNorm(d), 'norm2': nn.LayerNorm(d), 'gate1': GRUGate(d), 'gate2': GRUGate(d)}
        for name, module in modules.items():
            module.double().eval().load_state_dict(c[name])
        with torch.no_grad():
            return gated_block(c['x'], *modules.values())

    def reference(c):
        from xfam_lib.rl import GTrXLBlock
        block = GTrXLBlock(c['d'], c['heads'], c['d_ff'], gate='gru', bias_init=c['b_g']).double().eval()
        block.load_state_dict(c['block'])
        with torch.no_grad():
            return block(c['x'])

    def compare(c, got, expected):
        from xfam_grading import output_problems
        problems = output_problems(got, expected)
        if problems:
            raise AssertionError('; '.join(problems + mistakes(c, got)))

    def mistakes(c, got):
        """The known mistakes whose output the answer reproduces."""
        from torch import nn
        from xfam_lib.attention import MultiHeadAttention
        from xfam_lib.rl import GRUGate
        from xfam_lib.transformer import FeedForward
        if not isinstance(got, torch.Tensor) or got.shape != c['x'].shape:
            return []
        d = c['d']
        m = {'attn': MultiHeadAttention(d, c['heads']), 'ff': FeedForward(d, c['d_ff']), 'norm1': nn.LayerNorm(d), 'norm2': nn.LayerNorm(d), 'gate1': GRUGate(d), 'gate2': GRUGate(d)}
        for name, module in m.items():
            module.double().eval().load_state_dict(c[name])

        def swapped():
            with torch.no_grad():
                y = torch.relu(m['attn'](m['norm1'](c['x']), causal=True))
                x = m['gate1'](y, c['x'])
                return m['gate2'](torch.relu(m['ff'](m['norm2'](x))), x)
        named = [("the gates' arguments are swapped: gate(x, y) takes the stream x first, then the sub-layer's output y", swapped)]
        return [why for why, mistake in named if torch.allclose(got, mistake(), atol=1e-08)]
    check_cases('small layers', params=[{'B': 2, 'L': 5, 'd': 8, 'heads': 2, 'd_ff': 16, 'b_g': 2.0}, {'B': 1, 'L': 6, 'd': 6, 'heads': 3, 'd_ff': 12, 'b_g': 0.0}], make_case=make_case, submission=submission, reference=reference, compare=compare)

