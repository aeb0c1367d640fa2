from otter.test_files import test_case

OK_FORMAT = False

name = "q2b"
points = [0]

@test_case(points=None, hidden=False)
def test_q2b_public(span_weights):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        return {'scores': p['score scale'] * torch.randn(p['B'], len(p['spans']), p['L'], p['L'], dtype=torch.float64), 'z': torch.tensor(p['spans'], dtype=torch.float64)[:, None, None], 'ramp': p['ramp']}

    def submission(c):
        return span_weights(c['scores'], c['z'], c['ramp'])

    def reference(c):
        s, z, ramp = (c['scores'], c['z'], c['ramp'])
        length = s.shape[-1]
        w = torch.zeros_like(s)
        for i in range(length):
            m = ((ramp + z[:, :, 0] - (i - torch.arange(i + 1, dtype=s.dtype))) / ramp).clamp(0, 1)
            e = m * torch.exp(s[..., i, :i + 1] - s[..., i, :i + 1].amax(-1, keepdim=True))
            w[..., i, :i + 1] = e / e.sum(-1, keepdim=True)
        return w
    check_cases('span weights', params=[{'B': 2, 'L': 6, 'spans': (1.0, 3.5), 'ramp': 2.0, 'score scale': 1.0}, {'B': 1, 'L': 4, 'spans': (2.5, 10.0), 'ramp': 1.0, 'score scale': 1000.0}], make_case=make_case, submission=submission, reference=reference)

