from otter.test_files import test_case

OK_FORMAT = False

name = "q2a"
points = [0]

@test_case(points=None, hidden=False)
def test_q2a_public(softmax_jacobian):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        y = torch.softmax(p['spread'] * torch.randn(*p['shape'], dtype=torch.float64), -1)
        if p['kind'] == 'one-hot':
            y = torch.nn.functional.one_hot(torch.randint(0, p['shape'][-1], p['shape'][:-1]), p['shape'][-1]).double()
        return {'y': y.to(getattr(torch, p['dtype']))}

    def submission(c):
        return softmax_jacobian(c['y'])

    def reference(c):
        y = c['y'].double()
        rows = [torch.autograd.functional.jacobian(lambda t: torch.softmax(t, -1), torch.log(row.clamp_min(1e-300))) if row.max() < 1 else torch.zeros(y.shape[-1], y.shape[-1], dtype=torch.float64) for row in y.reshape(-1, y.shape[-1])]
        return torch.stack(rows).reshape(*y.shape, y.shape[-1]).to(c['y'].dtype)
    check_cases('small', params=[{'shape': (3,), 'spread': 1.0, 'kind': 'softmax', 'dtype': 'float64'}, {'shape': (2, 4), 'spread': 1.0, 'kind': 'softmax', 'dtype': 'float32'}, {'shape': (4,), 'spread': 1.0, 'kind': 'one-hot', 'dtype': 'float64'}], make_case=make_case, submission=submission, reference=reference)

