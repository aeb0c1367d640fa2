from otter.test_files import test_case

OK_FORMAT = False

name = "q1a"
points = [0]

@test_case(points=None, hidden=False)
def test_q1a_public(sinusoidal_pe):
    import torch
    from xfam_grading import check_cases

    def table(length, d, base):
        """The formula in float64: PE[p, 2i] = sin(p base^(-2i/d)), PE[p, 2i+1] = cos(...)."""
        theta = torch.tensor([base ** (-2 * i / d) for i in range(d // 2)], dtype=torch.float64)
        angles = torch.outer(torch.arange(length, dtype=torch.float64), theta)
        return torch.stack((torch.sin(angles), torch.cos(angles)), dim=-1).flatten(1)

    def make_case(p):
        return dict(p)

    def submission(c):
        return sinusoidal_pe(c['length'], c['d_model'], c['base'])

    def reference(c):
        return table(c['length'], c['d_model'], c['base']).float()
    check_cases('tables', params=[{'length': 6, 'd_model': 8, 'base': 10000.0}, {'length': 4096, 'd_model': 16, 'base': 10000.0}], make_case=make_case, submission=submission, reference=reference)

