from otter.test_files import test_case

OK_FORMAT = False

name = "q2a"
points = [0]

@test_case(points=None, hidden=False)
def test_q2a_public(induction_score):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        length, lead = (p['L'], tuple(p['leading dims']))
        if p['tokens'] == 'x x':
            first = torch.randperm(30)[:length // 2] + 2
            tokens = torch.cat([first, first])
        else:
            tokens = torch.randint(2, 2 + p['vocab'], (length,))
        tokens = tokens.expand(*lead[:-1], 1, length).clone() if lead else tokens
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        head = p['head']
        if head == 'induction':
            flat = tokens.reshape(-1, length)[0]
            w = torch.zeros(length, length, dtype=torch.float64)
            for i in range(length):
                hits = [j for j in range(1, i + 1) if flat[j - 1] == flat[i]]
                w[i, hits or [i]] = 1.0 / max(1, len(hits))
        elif head == 'previous token':
            w = torch.zeros(length, length, dtype=torch.float64)
            w[0, 0] = 1.0
            w[torch.arange(1, length), torch.arange(length - 1)] = 1.0
        elif head == 'uniform causal':
            w = causal.double() / causal.sum(-1, keepdim=True)
        elif head == 'random causal':
            w = torch.softmax(torch.randn(*lead, length, length, dtype=torch.float64).masked_fill(~causal, float('-inf')), -1)
        else:
            w = torch.softmax(2 * torch.randn(*lead, length, length, dtype=torch.float64), -1)
        return {'weights': w.expand(*lead, length, length).clone(), 'tokens': tokens}

    def submission(c):
        out = {'score': induction_score(c['weights'], c['tokens'])}
        length = c['tokens'].shape[-1]
        try:
            induction_score(torch.eye(length, dtype=torch.float64), torch.arange(2, 2 + length))
            out['no earlier copy'] = 'nothing raised'
        except ValueError:
            out['no earlier copy'] = 'ValueError'
        return out

    def reference(c):
        from xfam_lib.attention import induction_score as library
        return {'score': library(c['weights'], c['tokens']).item(), 'no earlier copy': 'ValueError'}
    check_cases('heads', params=[{'head': 'induction', 'tokens': 'x x', 'L': 8, 'vocab': 0, 'leading dims': ()}, {'head': 'previous token', 'tokens': 'x x', 'L': 8, 'vocab': 0, 'leading dims': ()}, {'head': 'uniform causal', 'tokens': 'x x', 'L': 10, 'vocab': 0, 'leading dims': ()}, {'head': 'uniform causal', 'tokens': 'small vocabulary', 'L': 12, 'vocab': 3, 'leading dims': ()}, {'head': 'random, not causal', 'tokens': 'small vocabulary', 'L': 9, 'vocab': 4, 'leading dims': ()}, {'head': 'random causal', 'tokens': 'small vocabulary', 'L': 10, 'vocab': 3, 'leading dims': (2, 3)}], make_case=make_case, submission=submission, reference=reference)

