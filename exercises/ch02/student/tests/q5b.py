from otter.test_files import test_case

OK_FORMAT = False

name = "q5b"
points = [0]

@test_case(points=None, hidden=False)
def test_q5b_public(linear_concat_weights):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        d = p['d']
        return {'q': p['query scale'] * torch.randn(p['Lq'], d, dtype=torch.float64), 'k': torch.randn(p['Lk'], d, dtype=torch.float64), 'w': torch.randn(2 * d, dtype=torch.float64)}

    def submission(c):
        return linear_concat_weights(c['q'], c['k'], c['w'])

    def reference(c):
        q, k, w = (c['q'], c['k'], c['w'])
        scores = torch.tensor([[float(w @ torch.cat([q[i], k[j]])) for j in range(k.shape[0])] for i in range(q.shape[0])], dtype=torch.float64)
        return torch.softmax(scores, dim=1)
    check_cases('small inputs', params=[{'Lq': 2, 'Lk': 5, 'd': 4, 'query scale': 1.0}, {'Lq': 3, 'Lk': 4, 'd': 3, 'query scale': 10.0}], make_case=make_case, submission=submission, reference=reference)

