from otter.test_files import test_case

OK_FORMAT = False

name = "q4b"
points = [0]

@test_case(points=None, hidden=False)
def test_q4b_public(rev_inverse):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        d, hidden, lead = (p['d'], p['hidden'], p['leading dims'])
        F, G = (torch.nn.Sequential(torch.nn.Linear(d, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, d)).double() for _ in range(2))
        x1, x2 = (torch.randn(*lead, d, dtype=torch.float64), torch.randn(*lead, d, dtype=torch.float64))
        with torch.no_grad():
            y1 = x1 + F(x2)
            y2 = x2 + G(y1)
        return {'F': dict(F.state_dict()), 'G': dict(G.state_dict()), 'd': d, 'hidden': hidden, 'y1': y1, 'y2': y2}

    def submission(c):
        import torch
        F, G = (torch.nn.Sequential(torch.nn.Linear(c['d'], c['hidden']), torch.nn.Tanh(), torch.nn.Linear(c['hidden'], c['d'])).double() for _ in range(2))
        F.load_state_dict(c['F'])
        G.load_state_dict(c['G'])
        with torch.no_grad():
            x1, x2 = rev_inverse(F, G, c['y1'], c['y2'])
            return {'x1': x1, 'x2': x2}

    def reference(c):
        from xfam_lib.sparse import RevBlock
        F, G = (torch.nn.Sequential(torch.nn.Linear(c['d'], c['hidden']), torch.nn.Tanh(), torch.nn.Linear(c['hidden'], c['d'])).double() for _ in range(2))
        F.load_state_dict(c['F'])
        G.load_state_dict(c['G'])
        with torch.no_grad():
            x1, x2 = RevBlock(F, G).inverse(c['y1'], c['y2'])
            return {'x1': x1, 'x2': x2}
    check_cases('small blocks', params=[{'leading dims': lead, 'd': d, 'hidden': h} for lead, d, h in (((3,), 4, 8), ((2, 5), 3, 6))], make_case=make_case, submission=submission, reference=reference)

