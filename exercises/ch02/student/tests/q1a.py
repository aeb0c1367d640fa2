from otter.test_files import test_case

OK_FORMAT = False

name = "q1a"
points = [0]

@test_case(points=None, hidden=False)
def test_q1a_public(sdpa):
    import math
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        lq, lk, d_k, scale = (p['Lq'], p['Lk'], p['d_k'], p['score scale'])
        q = scale * torch.randn(lq, d_k, dtype=torch.float64)
        k = scale * torch.randn(lk, d_k, dtype=torch.float64)
        mask = torch.ones(lq, lk, dtype=torch.bool).tril()
        if p['mask'] == 'causal, last row fully masked':
            mask[-1] = False
        return {'q': q, 'k': k, 'v': torch.randn(lk, 3, dtype=torch.float64), 'mask': mask}

    def submission(c):
        out, weights = sdpa(c['q'], c['k'], c['v'])
        out_m, weights_m = sdpa(c['q'], c['k'], c['v'], c['mask'])
        return {'out, no mask': out, 'weights, no mask': weights, 'out, masked': out_m, 'weights, masked': weights_m}

    def reference(c):
        q, k, v, mask = (c['q'], c['k'], c['v'], c['mask'])
        scores = q @ k.T / math.sqrt(q.shape[-1])
        has_key = mask.any(-1, keepdim=True)
        w = torch.softmax(scores, -1)
        w_m = torch.softmax(scores.masked_fill(~mask, float('-inf')).masked_fill(~has_key, 0.0), -1) * has_key
        return {'out, no mask': w @ v, 'weights, no mask': w, 'out, masked': w_m @ v, 'weights, masked': w_m}
    check_cases('small attention', params=[{'Lq': 4, 'Lk': 4, 'd_k': 16, 'score scale': 1.0, 'mask': 'causal'}, {'Lq': 3, 'Lk': 5, 'd_k': 8, 'score scale': 1.0, 'mask': 'causal, last row fully masked'}, {'Lq': 4, 'Lk': 4, 'd_k': 16, 'score scale': 30.0, 'mask': 'causal'}], make_case=make_case, submission=submission, reference=reference)

