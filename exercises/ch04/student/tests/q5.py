from otter.test_files import test_case

OK_FORMAT = False

name = "q5"
points = [0]

@test_case(points=None, hidden=False)
def test_q5_public(da_weight, da_attention):
    import math
    import torch
    from xfam_lib.grading import check_cases

    def make_case(p):
        shape, alpha, beta = p
        return {'q': torch.randn(*shape, dtype=torch.float64), 'k': torch.randn(*shape, dtype=torch.float64), 'v': torch.randn(*shape[:-1], 3, dtype=torch.float64), 'alpha': alpha, 'beta': beta, 'dist': torch.tensor([0.0, 1.0, 2.5, 10.0, 1000.0, 100000.0], dtype=torch.float64)}

    def submission(c):
        return {'da_weight': da_weight(c['dist'], c['alpha'], c['beta']), 'da_attention': da_attention(c['q'], c['k'], c['v'], c['alpha'], c['beta'])}

    def reference(c):
        a, b = (c['alpha'], c['beta'])
        f = [(1 + math.exp(b)) * (1 / (1 + math.exp(b - a * x)) if b - a * x < 700 else 0.0) for x in c['dist'].tolist()]
        L = c['q'].shape[-2]
        rows = []
        for i in range(L):
            s = torch.stack([torch.relu((c['q'][..., i, :] * c['k'][..., j, :]).sum(-1)) * (1 + math.exp(b)) / (1 + math.exp(b - a * abs(i - j))) for j in range(L)], dim=-1)
            w = torch.softmax(s / math.sqrt(c['q'].shape[-1]), dim=-1)
            rows.append((w.unsqueeze(-2) @ c['v']).squeeze(-2))
        return {'da_weight': torch.tensor(f, dtype=torch.float64), 'da_attention': torch.stack(rows, dim=-2)}
    check_cases('small', params=[((6, 4), -0.5, 1.0)], make_case=make_case, submission=submission, reference=reference, isolated=False)

