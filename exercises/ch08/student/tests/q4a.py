from otter.test_files import test_case

OK_FORMAT = False

name = "q4a"
points = [0]

@test_case(points=None, hidden=False)
def test_q4a_public(gla_recurrent):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        shape = tuple(p['leading dims']) + (p['L'],)
        low, high = p['log gate range']
        state = torch.randn(*p['leading dims'], p['d_k'], p['d_v'], dtype=torch.float64)
        return {'q': torch.randn(*shape, p['d_k'], dtype=torch.float64), 'k': torch.randn(*shape, p['d_k'], dtype=torch.float64), 'v': torch.randn(*shape, p['d_v'], dtype=torch.float64), 'log_g': low + (high - low) * torch.rand(*shape, p['d_k'], dtype=torch.float64), 'initial_state': state if p['initial state'] == 'random' else None}

    def submission(c):
        out, S = gla_recurrent(c['q'], c['k'], c['v'], c['log_g'], c['initial_state'])
        return {'out': out, 'final state': S}

    def reference(c):
        from xfam_lib.linear import gated_linear_attention
        out, S = gated_linear_attention(c['q'], c['k'], c['v'], c['log_g'], mode='recurrent', initial_state=c['initial_state'], return_final_state=True)
        return {'out': out, 'final state': S}
    check_cases('small sequences', params=[{'leading dims': (2,), 'L': 6, 'd_k': 3, 'd_v': 2, 'log gate range': (-0.5, 0.0), 'initial state': 'none'}, {'leading dims': (1, 2), 'L': 5, 'd_k': 4, 'd_v': 3, 'log gate range': (-2.0, -0.1), 'initial state': 'random'}, {'leading dims': (), 'L': 7, 'd_k': 2, 'd_v': 5, 'log gate range': (-0.2, 0.0), 'initial state': 'random'}], make_case=make_case, submission=submission, reference=reference)

