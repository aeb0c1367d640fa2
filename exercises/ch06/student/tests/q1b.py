from otter.test_files import test_case

OK_FORMAT = False

name = "q1b"
points = [0]

@test_case(points=None, hidden=False)
def test_q1b_public(act):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        d = p['d']
        return {'state': torch.randn(p['B'], p['L'], d, dtype=torch.float64), 'W': torch.randn(d, d, dtype=torch.float64) / d ** 0.5, 'w': torch.randn(d, dtype=torch.float64), 'bias': p['halting bias'], 'threshold': p['threshold'], 'max_steps': p['max_steps']}

    def submission(c):
        import torch
        calls = []

        def step_fn(state, n):
            calls.append(n)
            new = torch.tanh(state @ c['W'] + state.mean(-2, keepdim=True) + 0.1 * n)
            return (new, torch.sigmoid(new @ c['w'] + c['bias']))
        output, ponder, n_updates = act(step_fn, c['state'], c['threshold'], c['max_steps'])
        return {'output': output, 'ponder': ponder, 'n_updates': torch.as_tensor(n_updates).to(torch.float64), 'steps called': len(calls)}

    def reference(c):
        from xfam_lib.adaptive import act_halting
        calls = []

        def step_fn(state, n):
            calls.append(n)
            new = torch.tanh(state @ c['W'] + state.mean(-2, keepdim=True) + 0.1 * n)
            return (new, torch.sigmoid(new @ c['w'] + c['bias']))
        out = act_halting(step_fn, c['state'], c['threshold'], c['max_steps'])
        return {'output': out.output, 'ponder': out.ponder, 'n_updates': out.n_updates, 'steps called': len(calls)}
    check_cases('ACT loop', params=[{'B': 2, 'L': 5, 'd': 4, 'halting bias': -1.0, 'threshold': 0.99, 'max_steps': 6}, {'B': 1, 'L': 6, 'd': 3, 'halting bias': -2.5, 'threshold': 0.9, 'max_steps': 3}, {'B': 2, 'L': 3, 'd': 4, 'halting bias': 3.0, 'threshold': 0.9, 'max_steps': 8}, {'B': 2, 'L': 6, 'd': 8, 'halting bias': 0.0, 'threshold': 0.5, 'max_steps': 6}], make_case=make_case, submission=submission, reference=reference)

