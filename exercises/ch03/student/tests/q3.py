from otter.test_files import test_case

OK_FORMAT = False

name = "q3"
points = [0]

@test_case(points=None, hidden=False)
def test_q3_public(logn_factor, logn_attention):
    import math
    import torch
    import torch.nn.functional as F
    from xfam_lib.grading import check_cases

    def make_case(p):
        lq, lk, d, m = p
        return {'m': m, 'q': torch.randn(lq, d, dtype=torch.float64), 'k': torch.randn(lk, d, dtype=torch.float64), 'v': torch.randn(lk, 3, dtype=torch.float64)}

    def submission(c):
        return {'factor_4096_512': logn_factor(4096, 512), 'out': logn_attention(c['q'], c['k'], c['v'], c['m'])}

    def reference(c):
        scale = math.log(c['k'].shape[0]) / math.log(c['m']) / math.sqrt(c['q'].shape[-1])
        return {'factor_4096_512': 4 / 3, 'out': F.scaled_dot_product_attention(c['q'], c['k'], c['v'], scale=scale)}
    check_cases('small', params=[(4, 16, 8, 4)], make_case=make_case, submission=submission, reference=reference, isolated=False)

