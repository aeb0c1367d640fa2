from otter.test_files import test_case

OK_FORMAT = False

name = "q3"
points = [0]

@test_case(points=None, hidden=False)
def test_q3_public(causal_mask):
    import torch
    from xfam_lib.grading import check_cases

    def reference(c):
        n, start = c
        return torch.tensor([[j <= start + i for j in range(start + n)] for i in range(n)], dtype=torch.bool)
    check_cases('small masks', params=[(3, 0), (2, 3)], make_case=lambda p: p, submission=lambda c: causal_mask(*c), reference=reference, isolated=False)

