from otter.test_files import test_case

OK_FORMAT = False

name = "q5"
points = [0]

@test_case(points=None, hidden=False)
def test_q5_public(shared_qk_checks, asymmetry, linear_concat_weights, score_flops):
    import torch
    from xfam_lib.grading import check_cases

    def make_case(p):
        length, d = p
        return {'x': torch.randn(length, d, dtype=torch.float64), 'W': torch.randn(d, d, dtype=torch.float64), 'W_k': torch.randn(d, d, dtype=torch.float64), 'q': torch.randn(2, d, dtype=torch.float64), 'k': torch.randn(5, d, dtype=torch.float64), 'w': torch.randn(2 * d, dtype=torch.float64)}

    def submission(c):
        return {'shared_qk_checks': tuple(shared_qk_checks(c['x'], c['W'])), 'asymmetry is positive': asymmetry(c['x'], c['W'], c['W_k']) > 0, 'linear_concat_weights': linear_concat_weights(c['q'], c['k'], c['w']), 'score_flops(4, 3, 2)': tuple(score_flops(4, 3, 2))}

    def reference(c):
        d = c['q'].shape[1]
        row = torch.softmax(c['k'] @ c['w'][d:], dim=0)
        return {'shared_qk_checks': (True, True), 'asymmetry is positive': True, 'linear_concat_weights': row.expand(2, -1), 'score_flops(4, 3, 2)': (96, 160)}
    check_cases('small inputs', params=[(6, 4)], make_case=make_case, submission=submission, reference=reference, isolated=False)

