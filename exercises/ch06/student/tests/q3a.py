from otter.test_files import test_case

OK_FORMAT = False

name = "q3a"
points = [0]

@test_case(points=None, hidden=False)
def test_q3a_public(geometric_exit):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        return {'chi': torch.tensor(p['chi'], dtype=torch.float64)}

    def submission(c):
        return geometric_exit(c['chi'])

    def reference(c):
        chi = c['chi'].tolist()
        rows = chi if isinstance(chi[0], list) else [chi]
        out = []
        for row in rows:
            survive, q = (1.0, [])
            for n, x in enumerate(row):
                q.append(survive if n == len(row) - 1 else survive * x)
                survive *= 1.0 - x
            out.append(q)
        return torch.tensor(out if isinstance(chi[0], list) else out[0], dtype=torch.float64)
    check_cases('exit distribution', params=[{'chi': [0.5, 0.5, 0.5, 0.9]}, {'chi': [[0.1, 0.2, 0.3], [0.0, 1.0, 0.5], [0.9, 0.0, 0.0]]}, {'chi': [0.3]}], make_case=make_case, submission=submission, reference=reference)

