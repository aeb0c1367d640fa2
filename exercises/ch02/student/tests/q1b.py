from otter.test_files import test_case

OK_FORMAT = False

name = "q1b"
points = [0]

@test_case(points=None, hidden=False)
def test_q1b_public(misplaced_weights):
    import math
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        scale = p['score scale']
        return {'q': scale * torch.randn(3, p['d_k'], dtype=torch.float64), 'k': scale * torch.randn(5, p['d_k'], dtype=torch.float64)}

    def submission(c):
        return misplaced_weights(c['q'], c['k'])

    def reference(c):
        raw = (c['q'] @ c['k'].T).to(torch.float64)
        e = torch.exp(raw - raw.amax(-1, keepdim=True))
        return e / (math.sqrt(c['q'].shape[-1]) * e.sum(-1, keepdim=True))
    check_cases('misprinted weights', params=[{'d_k': 16, 'score scale': 1.0}, {'d_k': 16, 'score scale': 20.0}], make_case=make_case, submission=submission, reference=reference)

