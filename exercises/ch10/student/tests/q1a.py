from otter.test_files import test_case

OK_FORMAT = False

name = "q1a"
points = [0]

@test_case(points=None, hidden=False)
def test_q1a_public(gru_gate):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        shape = tuple(p['shape'])
        d = shape[-1]
        mats = {n: p['weight scale'] * torch.randn(d, d, dtype=torch.float64) / d ** 0.5 for n in ('W_r', 'W_z', 'W_g', 'U_r', 'U_z', 'U_g')}
        b_g = {'random': torch.randn(d, dtype=torch.float64), 'zero': torch.zeros(d, dtype=torch.float64), 'large': torch.full((d,), 40.0, dtype=torch.float64)}[p['b_g']]
        return dict(mats, x=torch.randn(*shape, dtype=torch.float64), y=torch.randn(*shape, dtype=torch.float64), b_g=b_g)

    def submission(c):
        return gru_gate(c['x'], c['y'], c['W_r'], c['W_z'], c['W_g'], c['U_r'], c['U_z'], c['U_g'], c['b_g'])

    def reference(c):
        from xfam_lib.rl import GRUGate
        gate = GRUGate(c['x'].shape[-1]).double()
        with torch.no_grad():
            gate.W.weight.copy_(torch.cat([c['W_r'].T, c['W_z'].T, c['W_g'].T]))
            gate.U_rz.weight.copy_(torch.cat([c['U_r'].T, c['U_z'].T]))
            gate.U_g.weight.copy_(c['U_g'].T)
            gate.b_g.copy_(c['b_g'])
            return gate(c['x'], c['y'])
    check_cases('small gates', params=[{'shape': (2, 5, 6), 'b_g': 'random', 'weight scale': 2.0}, {'shape': (4, 3), 'b_g': 'zero', 'weight scale': 2.0}, {'shape': (6,), 'b_g': 'random', 'weight scale': 2.0}, {'shape': (2, 3, 4), 'b_g': 'large', 'weight scale': 2.0}], make_case=make_case, submission=submission, reference=reference)

