from otter.test_files import test_case

OK_FORMAT = False

name = "q5a"
points = [0]

@test_case(points=None, hidden=False)
def test_q5a_public(universal_encoder):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        from xfam_lib.transformer import EncoderLayer
        layer = EncoderLayer(p['d'], p['H'], 2 * p['d']).double()
        x = torch.randn(p['B'], p['L'], p['d'], dtype=torch.float64)
        return {'x': x, 'w': torch.randn_like(x), 'state': dict(layer.state_dict()), 'n_steps': p['T'], 'd': p['d'], 'H': p['H']}

    def submission(c):
        from xfam_lib.transformer import EncoderLayer
        layer = EncoderLayer(c['d'], c['H'], 2 * c['d']).double()
        layer.load_state_dict(c['state'])
        out = universal_encoder(c['x'], layer, c['n_steps'])
        (out * c['w']).sum().backward()
        grads = {name: torch.zeros_like(p) if p.grad is None else p.grad for name, p in layer.named_parameters()}
        return {'out': out.detach(), 'grad': grads}

    def reference(c):
        from xfam_lib.adaptive import UniversalTransformer
        ut = UniversalTransformer(c['d'], c['H'], 2 * c['d'], c['n_steps']).double()
        ut.layer.load_state_dict(c['state'])
        out = ut(c['x'])
        (out * c['w']).sum().backward()
        return {'out': out.detach(), 'grad': {name: p.grad for name, p in ut.layer.named_parameters()}}
    check_cases('small encoders', params=[{'B': 2, 'L': 5, 'd': 8, 'H': 2, 'T': 3}, {'B': 1, 'L': 4, 'd': 6, 'H': 1, 'T': 1}, {'B': 1, 'L': 3, 'd': 4, 'H': 2, 'T': 4}], make_case=make_case, submission=submission, reference=reference)

