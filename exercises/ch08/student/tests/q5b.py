from otter.test_files import test_case

OK_FORMAT = False

name = "q5b"
points = [0]

@test_case(points=None, hidden=False)
def test_q5b_public(retention_chunk):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        shape = tuple(p['leading dims']) + (p['L'],)
        return {'q': torch.randn(*shape, p['d_k'], dtype=torch.float64), 'k': torch.randn(*shape, p['d_k'], dtype=torch.float64), 'v': torch.randn(*shape, p['d_v'], dtype=torch.float64), 'gamma': p['gamma'], 'chunk': p['chunk']}

    def submission(c):
        return retention_chunk(c['q'], c['k'], c['v'], c['gamma'], c['chunk'])

    def reference(c):
        from xfam_lib.linear import retention
        return retention(c['q'], c['k'], c['v'], c['gamma'], mode='parallel')
    check_cases('chunk sizes and decays', params=[{'leading dims': (2,), 'L': 8, 'd_k': 3, 'd_v': 2, 'gamma': 0.9, 'chunk': 4}, {'leading dims': (), 'L': 7, 'd_k': 2, 'd_v': 3, 'gamma': 0.5, 'chunk': 3}, {'leading dims': (1, 2), 'L': 6, 'd_k': 4, 'd_v': 4, 'gamma': 1.0, 'chunk': 1}, {'leading dims': (2,), 'L': 5, 'd_k': 3, 'd_v': 2, 'gamma': 0.8, 'chunk': 16}], make_case=make_case, submission=submission, reference=reference)

    def largest(c):
        from xfam_lib.bench import largest_intermediate
        size = largest_intermediate(lambda: retention_chunk(c['q'], c['k'], c['v'], c['gamma'], c['chunk']))
        return torch.tensor(float(size < c['q'].shape[-2] ** 2))
    check_cases('no L x L tensor (1 = none)', params=[{'leading dims': (), 'L': 48, 'd_k': 4, 'd_v': 4, 'gamma': 0.9, 'chunk': 8}], make_case=make_case, submission=largest, reference=lambda c: torch.tensor(1.0))

