from otter.test_files import test_case

OK_FORMAT = False

name = "q1a"
points = [0]

@test_case(points=None, hidden=False)
def test_q1a_public(halting_weights):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        return {'p': torch.tensor(p['p'], dtype=torch.float64), 'threshold': p['threshold']}

    def submission(c):
        weights, ponder = halting_weights(c['p'], c['threshold'])
        return {'weights': weights, 'ponder': ponder}

    def reference(c):
        from xfam_lib.adaptive import act_halting
        p = c['p']
        steps = p.shape[-1]
        step = lambda state, n: (torch.eye(steps, dtype=p.dtype)[n].expand_as(state), p[..., n])
        out = act_halting(step, torch.zeros_like(p), c['threshold'], steps)
        return {'weights': out.output, 'ponder': out.ponder}
    check_cases('halting', params=[{'p': [[0.25, 0.25, 0.5, 0.5], [0.75, 0.5, 0.5, 0.5], [0.125, 0.125, 0.125, 0.125]], 'threshold': 0.5}, {'p': [[0.5, 0.25, 0.25, 0.25], [0.25, 0.25, 0.25, 0.25]], 'threshold': 1.0}, {'p': [[0.1, 0.3, 0.9], [0.9, 0.05, 0.01]], 'threshold': 0.99}], make_case=make_case, submission=submission, reference=reference)

