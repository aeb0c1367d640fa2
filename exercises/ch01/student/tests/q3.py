from otter.test_files import test_case

OK_FORMAT = False

name = "q3"
points = [0]

@test_case(points=None, hidden=False)
def test_q3_public(causal_mask):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        return dict(p)

    def submission(c):
        return causal_mask(c['seqlen'], c['start_pos'])

    def reference(c):
        n, start = (c['seqlen'], c['start_pos'])
        return torch.tensor([[j <= start + i for j in range(start + n)] for i in range(n)], dtype=torch.bool)
    check_cases('small masks', params=[{'seqlen': 3, 'start_pos': 0}, {'seqlen': 2, 'start_pos': 3}], make_case=make_case, submission=submission, reference=reference)

