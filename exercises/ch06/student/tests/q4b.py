from otter.test_files import test_case

OK_FORMAT = False

name = "q4b"
points = [0]

@test_case(points=None, hidden=False)
def test_q4b_public(exit_index):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        return {'conf': torch.tensor(p['conf'], dtype=torch.float64), 'threshold': p['threshold']}

    def submission(c):
        return torch.as_tensor(exit_index(c['conf'], c['threshold'])).long()

    def reference(c):
        rows = c['conf'].reshape(-1, c['conf'].shape[-1]).tolist()
        exits = [next((n for n, x in enumerate(row) if x > c['threshold']), len(row) - 1) for row in rows]
        return torch.tensor(exits).reshape(c['conf'].shape[:-1])
    check_cases('exits', params=[{'conf': [[0.1, 0.6, 0.9], [0.5, 0.5, 0.7], [0.2, 0.3, 0.4], [0.9, 0.1, 0.1]], 'threshold': 0.5}, {'conf': [[[0.5, 0.5], [0.25, 0.75]]], 'threshold': 0.5}], make_case=make_case, submission=submission, reference=reference)

