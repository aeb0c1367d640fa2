from otter.test_files import test_case

OK_FORMAT = False

name = "q1b"
points = [0]

@test_case(points=None, hidden=False)
def test_q1b_public(recall_accuracy):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        b, length, vocab, n_answers = (p['B'], p['L'], p['vocab'], p['answers per row'])
        targets = torch.zeros(b, length, dtype=torch.long)
        targets[:, length - n_answers:] = torch.randint(2, vocab, (b, n_answers))
        logits = torch.randn(b, length, vocab, dtype=torch.float64)
        hit = torch.rand(b, length) < p['hit rate']
        boost = torch.zeros_like(logits).scatter_(-1, targets[..., None], 10.0)
        return {'logits': logits + boost * hit[..., None], 'targets': targets}

    def submission(c):
        out = {'accuracy': recall_accuracy(c['logits'], c['targets'])}
        try:
            recall_accuracy(c['logits'], torch.zeros_like(c['targets']))
            out['every target PAD'] = 'nothing raised'
        except ValueError:
            out['every target PAD'] = 'ValueError'
        return out

    def reference(c):
        keep = c['targets'] != 0
        hits = (c['logits'].argmax(-1) == c['targets']) & keep
        return {'accuracy': int(hits.sum()) / int(keep.sum()), 'every target PAD': 'ValueError'}
    check_cases('recall batches', params=[{'B': 4, 'L': 10, 'vocab': 12, 'answers per row': 3, 'hit rate': 0.5}, {'B': 8, 'L': 6, 'vocab': 9, 'answers per row': 1, 'hit rate': 0.7}], make_case=make_case, submission=submission, reference=reference)

