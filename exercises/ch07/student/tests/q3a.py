from otter.test_files import test_case

OK_FORMAT = False

name = "q3a"
points = [0]

@test_case(points=None, hidden=False)
def test_q3a_public(lsh_buckets):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        from xfam_lib.sparse import lsh_rotations
        lead, length, d = (p['leading dims'], p['L'], p['d'])
        rotations = lsh_rotations(d, p['n_buckets'], p['n_rounds'], p['seed'], dtype=torch.float64)
        return {'x': torch.randn(*lead, length, d, dtype=torch.float64), 'rotations': rotations, 'n_buckets': p['n_buckets'], 'n_rounds': p['n_rounds'], 'seed': p['seed']}

    def submission(c):
        return lsh_buckets(c['x'], c['rotations'])

    def reference(c):
        from xfam_lib.sparse import lsh_hash
        return lsh_hash(c['x'], c['n_buckets'], c['n_rounds'], c['seed'])
    check_cases('small', params=[{'leading dims': lead, 'L': L, 'd': d, 'n_buckets': b, 'n_rounds': r, 'seed': seed} for lead, L, d, b, r, seed in (((), 8, 4, 4, 1, 0), ((), 10, 6, 8, 3, 1), ((2,), 6, 3, 2, 2, 2))], make_case=make_case, submission=submission, reference=reference)

