from otter.test_files import test_case

OK_FORMAT = False

name = "q5a"
points = [0]

@test_case(points=None, hidden=False)
def test_q5a_public(repeat_kv):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        return {'x': torch.randn(*p['x shape'], dtype=torch.float64), 'n_rep': p['n_rep']}

    def submission(c):
        return repeat_kv(c['x'], c['n_rep'])

    def reference(c):
        from xfam_lib.attention import repeat_kv as library_repeat_kv
        return library_repeat_kv(c['x'], c['n_rep'])
    check_cases('small', params=[{'x shape': (1, 2, 3, 4), 'n_rep': 2}, {'x shape': (2, 3, 5, 4), 'n_rep': 4}], make_case=make_case, submission=submission, reference=reference)

