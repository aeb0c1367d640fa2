from otter.test_files import test_case

OK_FORMAT = False

name = "q4a"
points = [0]

@test_case(points=None, hidden=False)
def test_q4a_public(scaling_exponent):
    import math
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        lengths = torch.tensor(p['lengths'], dtype=torch.float64)
        noise = torch.exp(p['noise'] * torch.randn(len(p['lengths']), dtype=torch.float64))
        times = (p['c'] * lengths ** p['p'] + p['overhead']) * noise
        return {'lengths': lengths, 'times': times}

    def submission(c):
        exponent, prefactor = scaling_exponent(c['lengths'], c['times'])
        return {'exponent': exponent, 'prefactor': prefactor}

    def reference(c):
        x, y = (c['lengths'].log(), c['times'].log())
        A = torch.stack([x, torch.ones_like(x)], dim=1)
        slope, intercept = torch.linalg.lstsq(A, y[:, None], driver='gelsd').solution[:, 0].tolist()
        return {'exponent': slope, 'prefactor': math.exp(intercept)}
    check_cases('fits', params=[{'lengths': (64, 128, 256, 512, 1024), 'c': 2e-07, 'p': 2.0, 'overhead': 0.0, 'noise': 0.0}, {'lengths': (128, 256, 512, 1024, 2048, 4096), 'c': 3e-05, 'p': 1.0, 'overhead': 0.0, 'noise': 0.0}, {'lengths': (64, 128, 256, 512, 1024, 2048), 'c': 1e-07, 'p': 2.0, 'overhead': 0.0, 'noise': 0.2}, {'lengths': (256, 512, 1024, 2048, 4096), 'c': 1e-08, 'p': 2.0, 'overhead': 0.002, 'noise': 0.05}], make_case=make_case, submission=submission, reference=reference)

