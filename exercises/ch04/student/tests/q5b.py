from otter.test_files import test_case

OK_FORMAT = False

name = "q5b"
points = [0]

@test_case(points=None, hidden=False)
def test_q5b_public(da_attention):
    import math
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        shape = p['q, k shape']
        q, k = (torch.randn(*shape, dtype=torch.float64), torch.randn(*shape, dtype=torch.float64))
        if p['scores'] == 'mostly negative':
            k = -q.abs().flip(-2)
        return {'q': q, 'k': k, 'v': torch.randn(*shape[:-1], 3, dtype=torch.float64), 'alpha': p['alpha'], 'beta': p['beta']}

    def submission(c):
        return da_attention(c['q'], c['k'], c['v'], c['alpha'], c['beta'])

    def reference(c):
        a, b = (c['alpha'], c['beta'])
        L = c['q'].shape[-2]
        rows = []
        for i in range(L):
            s = torch.stack([torch.relu((c['q'][..., i, :] * c['k'][..., j, :]).sum(-1)) * (1 + math.exp(b)) / (1 + math.exp(b - a * abs(i - j))) for j in range(L)], dim=-1)
            w = torch.softmax(s / math.sqrt(c['q'].shape[-1]), dim=-1)
            rows.append((w.unsqueeze(-2) @ c['v']).squeeze(-2))
        return torch.stack(rows, dim=-2)
    check_cases('small', params=[{'q, k shape': (6, 4), 'scores': 'random', 'alpha': -0.5, 'beta': 1.0}, {'q, k shape': (5, 4), 'scores': 'mostly negative', 'alpha': 1.0, 'beta': 2.0}], make_case=make_case, submission=submission, reference=reference)

