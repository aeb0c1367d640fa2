from otter.test_files import test_case

OK_FORMAT = False

name = "q3a"
points = [0]

@test_case(points=None, hidden=False)
def test_q3a_public(alibi_slopes):
    import math
    import torch
    from xfam_grading import check_cases

    def slopes_rule(n):
        """The paper's code, re-typed: start = 2^(-2^-(log2 n - 3)), geometric; the interleaving rule otherwise."""

        def power_of_2(m):
            start = 2 ** (-2 ** (-(math.log2(m) - 3)))
            return [start * start ** i for i in range(m)]
        if math.log2(n).is_integer():
            return power_of_2(n)
        closest = 2 ** math.floor(math.log2(n))
        return power_of_2(closest) + slopes_rule(2 * closest)[0::2][:n - closest]

    def make_case(p):
        return dict(p)

    def submission(c):
        return alibi_slopes(c['n_heads'])

    def reference(c):
        return torch.tensor(slopes_rule(c['n_heads']), dtype=torch.float32)
    check_cases('slopes', params=[{'n_heads': 8}, {'n_heads': 12}], make_case=make_case, submission=submission, reference=reference)

