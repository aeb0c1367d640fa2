from otter.test_files import test_case

OK_FORMAT = False

name = "q3b"
points = [0]

@test_case(points=None, hidden=False)
def test_q3b_public(logn_attention):
    import math
    import torch
    import torch.nn.functional as F
    from xfam_grading import check_cases

    def make_case(p):
        t = getattr(torch, p['dtype'])
        lead = p['leading dims']
        return {'m': p['train_len'], 'q': torch.randn(*lead, p['Lq'], p['d'], dtype=t), 'k': torch.randn(*lead, p['Lk'], p['d'], dtype=t), 'v': torch.randn(*lead, p['Lk'], p['d_v'], dtype=t)}

    def submission(c):
        return logn_attention(c['q'], c['k'], c['v'], c['m'])

    def reference(c):
        q, k, v, m = (c['q'].double(), c['k'].double(), c['v'].double(), c['m'])
        scale = math.log(k.shape[-2]) / math.log(m) / math.sqrt(q.shape[-1])
        return F.scaled_dot_product_attention(q, k, v, scale=scale).to(c['q'].dtype)
    check_cases('small', params=[{'leading dims': (), 'Lq': 4, 'Lk': 16, 'd': 8, 'd_v': 3, 'train_len': 4, 'dtype': 'float64'}, {'leading dims': (2,), 'Lq': 5, 'Lk': 9, 'd': 4, 'd_v': 2, 'train_len': 3, 'dtype': 'float32'}], make_case=make_case, submission=submission, reference=reference)

