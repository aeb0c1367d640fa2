from otter.test_files import test_case

OK_FORMAT = False

name = "q6b"
points = [0]

@test_case(points=None, hidden=False)
def test_q6b_public(delta_chunk):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        lead, C, d_k, d_v = (tuple(p['leading dims']), p['chunk_size'], p['d_k'], p['d_v'])
        k = torch.randn(*lead, C, d_k, dtype=torch.float64)
        k = torch.nn.functional.normalize(k, dim=-1) if p['keys'] == 'unit' else 0.8 * k / d_k ** 0.5
        S = torch.randn(*lead, d_k, d_v, dtype=torch.float64)
        return {'q': torch.randn(*lead, C, d_k, dtype=torch.float64), 'k': k, 'v': torch.randn(*lead, C, d_v, dtype=torch.float64), 'beta': torch.rand(*lead, C, dtype=torch.float64), 'S': S if p['entering state'] == 'random' else 0 * S}

    def submission(c):
        out, S_next, T = delta_chunk(c['q'], c['k'], c['v'], c['beta'], c['S'])
        return {'out': out, 'S_next': S_next, 'T': T}

    def reference(c):
        from xfam_lib.linear import delta_rule
        out, S_next = delta_rule(c['q'], c['k'], c['v'], c['beta'], scale=1.0, initial_state=c['S'], return_final_state=True)
        C = c['q'].shape[-2]
        A = (c['beta'][..., :, None] * (c['k'] @ c['k'].transpose(-2, -1))).tril(-1)
        return {'out': out, 'S_next': S_next, 'T': torch.linalg.inv(torch.eye(C, dtype=torch.float64) + A)}
    check_cases('one chunk', params=[{'leading dims': (2,), 'chunk_size': 1, 'd_k': 3, 'd_v': 2, 'keys': 'unit', 'entering state': 'random'}, {'leading dims': (), 'chunk_size': 5, 'd_k': 4, 'd_v': 3, 'keys': 'unit', 'entering state': 'none'}, {'leading dims': (1, 2), 'chunk_size': 6, 'd_k': 3, 'd_v': 4, 'keys': 'random length', 'entering state': 'random'}, {'leading dims': (2,), 'chunk_size': 3, 'd_k': 2, 'd_v': 2, 'keys': 'unit', 'entering state': 'random'}], make_case=make_case, submission=submission, reference=reference)

