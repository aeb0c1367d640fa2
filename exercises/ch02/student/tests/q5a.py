from otter.test_files import test_case

OK_FORMAT = False

name = "q5a"
points = [0]

@test_case(points=None, hidden=False)
def test_q5a_public(shared_qk_checks, asymmetry):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        length, d = (p['L'], p['d'])
        x = torch.randn(length, d, dtype=torch.float64)
        W = torch.linalg.qr(torch.randn(d, d, dtype=torch.float64)).Q if p['W'] == 'orthogonal' else torch.randn(d, d, dtype=torch.float64)
        return {'x': x, 'W': W, 'W_k': torch.randn(d, d, dtype=torch.float64)}

    def submission(c):
        return {'shared_qk_checks': tuple(shared_qk_checks(c['x'], c['W'])), 'asymmetry': asymmetry(c['x'], c['W'], c['W_k']), 'asymmetry with W_k = W_q': asymmetry(c['x'], c['W'], c['W'])}

    def reference(c):
        x, W = (c['x'], c['W'])
        S = x @ W @ (x @ W).T
        A = x @ W @ (x @ c['W_k']).T
        return {'shared_qk_checks': (True, not torch.allclose(S, x @ x.T)), 'asymmetry': float(torch.linalg.norm(A - A.T)), 'asymmetry with W_k = W_q': 0.0}
    check_cases('small inputs', params=[{'L': 6, 'd': 4, 'W': 'random'}, {'L': 5, 'd': 5, 'W': 'orthogonal'}], make_case=make_case, submission=submission, reference=reference)

