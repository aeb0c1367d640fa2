from otter.test_files import test_case

OK_FORMAT = False

name = "q3b"
points = [0]

@test_case(points=None, hidden=False)
def test_q3b_public(interleave, action_token_index):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        b, t, d = (p['B'], p['T'], p['d'])
        return {name: torch.randn(b, t, d, dtype=torch.float64) for name in ('R', 's', 'a')}

    def submission(c):
        tokens = interleave(c['R'], c['s'], c['a'])
        index = action_token_index(c['R'].shape[1])
        return {'tokens': tokens, 'action_token_index': index, 'tokens read at the index': tokens[:, index]}

    def reference(c):
        from xfam_lib.rl import dt_action_token_index, interleave_trajectory
        return {'tokens': interleave_trajectory(c['R'], c['s'], c['a']), 'action_token_index': dt_action_token_index(c['R'].shape[1]), 'tokens read at the index': c['s']}
    check_cases('small trajectories', params=[{'B': 1, 'T': 3, 'd': 2}, {'B': 2, 'T': 4, 'd': 5}], make_case=make_case, submission=submission, reference=reference)

