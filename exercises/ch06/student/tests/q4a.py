from otter.test_files import test_case

OK_FORMAT = False

name = "q4a"
points = [0]

@test_case(points=None, hidden=False)
def test_q4a_public(softmax_margin, saturation):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        shape = p['shape']
        return {'logits': p['logit scale'] * torch.randn(*shape, p['C'], dtype=torch.float64), 'h_prev': torch.randn(*shape, p['d'], dtype=torch.float64), 'h_next': p['state scale'] * torch.randn(*shape, p['d'], dtype=torch.float64)}

    def submission(c):
        return {'margin': softmax_margin(c['logits']), 'saturation': saturation(c['h_prev'], c['h_next'])}

    def reference(c):
        probs = torch.softmax(c['logits'], -1).sort(-1, descending=True).values
        a, b = (c['h_prev'], c['h_next'])
        return {'margin': probs[..., 0] - probs[..., 1], 'saturation': (a * b).sum(-1) / (a.square().sum(-1).sqrt() * b.square().sum(-1).sqrt())}
    check_cases('confidences', params=[{'shape': (3,), 'C': 5, 'd': 4, 'logit scale': 1.0, 'state scale': 3.0}, {'shape': (2, 4), 'C': 2, 'd': 8, 'logit scale': 200.0, 'state scale': 0.5}], make_case=make_case, submission=submission, reference=reference)

