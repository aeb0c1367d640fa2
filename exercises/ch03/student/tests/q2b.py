from otter.test_files import test_case

OK_FORMAT = False

name = "q2b"
points = [0]

@test_case(points=None, hidden=False)
def test_q2b_public(uniform_jacobian_norm):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        return dict(p)

    def submission(c):
        return uniform_jacobian_norm(c['n'])

    def reference(c):
        y = torch.full((c['n'],), 1.0 / c['n'], dtype=torch.float64)
        return float((torch.diag(y) - torch.outer(y, y)).norm())
    check_cases('norms', params=[{'n': 4}, {'n': 2}], make_case=make_case, submission=submission, reference=reference)

