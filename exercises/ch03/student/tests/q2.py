from otter.test_files import test_case

OK_FORMAT = False

name = "q2"
points = [0]

@test_case(points=None, hidden=False)
def test_q2_public(softmax_jacobian, uniform_jacobian_norm):
    import torch
    from xfam_lib.grading import check_cases

    def make_case(n):
        return torch.randn(n, dtype=torch.float64)

    def submission(x):
        return {'J': softmax_jacobian(torch.softmax(x, -1)), 'uniform_norm_n4': uniform_jacobian_norm(4)}

    def reference(x):
        return {'J': torch.autograd.functional.jacobian(lambda t: torch.softmax(t, -1), x), 'uniform_norm_n4': 3 ** 0.5 / 4}
    check_cases('one vector', params=[3, 5], make_case=make_case, submission=submission, reference=reference, isolated=False)

