from otter.test_files import test_case

OK_FORMAT = False

name = "q3a"
points = [0]

@test_case(points=None, hidden=False)
def test_q3a_public(knn_next_token):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        n_keys, d = (p['N'], p['d'])
        keys = torch.randn(n_keys, d, dtype=torch.float64)
        q = keys[torch.randint(0, n_keys, (p['n'],))] + 0.5 * torch.randn(p['n'], d, dtype=torch.float64)
        return {'q': q, 'keys': keys, 'vals': torch.randint(0, p['vocab'], (n_keys,)), 'k': p['k'], 'vocab': p['vocab'], 'temp': p['temp']}

    def submission(c):
        return knn_next_token(c['q'], c['keys'], c['vals'], c['k'], c['vocab'], c['temp'])

    def reference(c):
        from xfam_lib.memory import knn_distribution
        return knn_distribution(c['q'], c['keys'], c['vals'], c['k'], c['vocab'], c['temp'])
    check_cases('small datastores', params=[{'n': 2, 'N': 8, 'd': 3, 'k': 4, 'vocab': 3, 'temp': 1.0}, {'n': 3, 'N': 10, 'd': 4, 'k': 5, 'vocab': 2, 'temp': 2.0}, {'n': 1, 'N': 6, 'd': 2, 'k': 6, 'vocab': 4, 'temp': 0.5}], make_case=make_case, submission=submission, reference=reference)

