from otter.test_files import test_case

OK_FORMAT = False

name = "q4a"
points = [0]

@test_case(points=None, hidden=False)
def test_q4a_public(titans_write):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        dk, dv = (p['d_k'], p['d_v'])
        S = torch.randn(dk, dv, dtype=torch.float64) if p['S'] == 'random' else torch.zeros(dk, dv, dtype=torch.float64)
        return {'M': torch.randn(dk, dv, dtype=torch.float64), 'S': S, 'k': torch.randn(dk, dtype=torch.float64), 'v': torch.randn(dv, dtype=torch.float64), 'lr': p['lr'], 'momentum': p['momentum'], 'decay': p['decay']}

    def submission(c):
        M_new, S_new = titans_write(c['M'], c['S'], c['k'], c['v'], c['lr'], c['momentum'], c['decay'])
        return {'M_new': M_new, 'S_new': S_new}

    def reference(c):
        from xfam_lib.memory import NeuralMemory
        memory = NeuralMemory(c['M'].shape[0], 'delta', c['lr'], c['momentum'], c['decay'], d_value=c['M'].shape[1])
        memory.M, memory.S = (c['M'].clone(), c['S'].clone())
        memory.write(c['k'], c['v'])
        return {'M_new': memory.M, 'S_new': memory.S}
    check_cases('one write', params=[{'d_k': 3, 'd_v': 3, 'lr': 0.1, 'momentum': 0.0, 'decay': 0.0, 'S': 'zeros'}, {'d_k': 4, 'd_v': 2, 'lr': 0.3, 'momentum': 0.0, 'decay': 0.0, 'S': 'zeros'}, {'d_k': 3, 'd_v': 3, 'lr': 0.2, 'momentum': 0.9, 'decay': 0.0, 'S': 'random'}, {'d_k': 2, 'd_v': 3, 'lr': 0.1, 'momentum': 0.0, 'decay': 0.25, 'S': 'zeros'}, {'d_k': 3, 'd_v': 4, 'lr': 0.05, 'momentum': 0.5, 'decay': 0.1, 'S': 'random'}], make_case=make_case, submission=submission, reference=reference)

