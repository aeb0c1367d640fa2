from otter.test_files import test_case

OK_FORMAT = False

name = "q2a"
points = [0]

@test_case(points=None, hidden=False)
def test_q2a_public(span_mask):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        length = p['L']
        pos = torch.arange(length, dtype=torch.float64)
        return {'dist': (pos[:, None] - pos[None, :]).clamp_min(0), 'z': torch.tensor(p['spans'], dtype=torch.float64), 'ramp': p['ramp']}

    def submission(c):
        z = c['z'].clone()[:, None, None].requires_grad_(True)
        mask = span_mask(c['dist'], z, c['ramp'])
        mask.sum().backward()
        return {'mask': mask.detach(), 'd sum / d z': z.grad.flatten()}

    def reference(c):
        from xfam_lib.adaptive import soft_span_mask
        z = c['z'].clone()[:, None, None].requires_grad_(True)
        mask = soft_span_mask(c['dist'], z, c['ramp'])
        mask.sum().backward()
        return {'mask': mask.detach(), 'd sum / d z': z.grad.flatten()}
    check_cases('soft mask', params=[{'L': 8, 'spans': (0.0, 2.5, 5.0), 'ramp': 2.0}, {'L': 6, 'spans': (1.25,), 'ramp': 4.0}], make_case=make_case, submission=submission, reference=reference)

