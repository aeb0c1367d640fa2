from otter.test_files import test_case

OK_FORMAT = False

name = "q1"
points = [0]

@test_case(points=None, hidden=False)
def test_q1_public(sdpa, misplaced_weights):
    import math
    import torch
    import torch.nn.functional as F
    from xfam_lib.grading import check_cases

    def make_case(p):
        lq, lk, d_k, d_v = p
        q, k = (torch.randn(lq, d_k, dtype=torch.float64), torch.randn(lk, d_k, dtype=torch.float64))
        return {'q': q, 'k': k, 'v': torch.randn(lk, d_v, dtype=torch.float64), 'mask': torch.ones(lq, lk, dtype=torch.bool).tril()}

    def submission(c):
        out, weights = sdpa(c['q'], c['k'], c['v'])
        out_m, weights_m = sdpa(c['q'], c['k'], c['v'], c['mask'])
        return {'out': out, 'weights': weights, 'out causal': out_m, 'weights causal': weights_m, 'misplaced row sums': misplaced_weights(c['q'], c['k']).sum(-1)}

    def reference(c):
        q, k, v, mask = (c['q'], c['k'], c['v'], c['mask'])
        w = torch.softmax(q @ k.T / math.sqrt(q.shape[-1]), -1)
        w_m = torch.softmax((q @ k.T / math.sqrt(q.shape[-1])).masked_fill(~mask, float('-inf')), -1)
        return {'out': F.scaled_dot_product_attention(q, k, v), 'weights': w, 'out causal': F.scaled_dot_product_attention(q, k, v, attn_mask=mask), 'weights causal': w_m, 'misplaced row sums': torch.full((q.shape[0],), 1 / math.sqrt(q.shape[-1]), dtype=torch.float64)}
    check_cases('small attention', params=[(4, 4, 16, 8)], make_case=make_case, submission=submission, reference=reference, isolated=False)

