from otter.test_files import test_case

OK_FORMAT = False

name = "q4c"
points = [0]

@test_case(points=None, hidden=False)
def test_q4c_public(sequential_loss):
    import torch
    import torch.nn.functional as F
    from xfam_grading import check_cases
    from xfam_lib.transformer import EncoderDecoder

    def make_case(p):
        vocab = p['vocab']
        model = EncoderDecoder(vocab, 16, 2, p['layers'], p['layers'], 32, pad_id=None).double()
        return {'bos': p['bos'], 'vocab': vocab, 'layers': p['layers'], 'model': model.state_dict(), 'src': torch.randint(2, vocab, (p['B'], p['S'])), 'tgt': torch.randint(2, vocab, (p['B'], p['T']))}

    def gold(c):
        tgt = c['tgt']
        tgt_in = torch.cat([torch.full((tgt.shape[0], 1), c['bos'], dtype=tgt.dtype), tgt[:, :-1]], dim=1)
        model = EncoderDecoder(c['vocab'], 16, 2, c['layers'], c['layers'], 32, pad_id=None).double().eval()
        model.load_state_dict(c['model'])
        with torch.no_grad():
            logits = model(c['src'], tgt_in)
        return (tgt_in, F.cross_entropy(logits.flatten(0, 1), tgt.flatten()))

    def submission(c):
        import torch
        from xfam_lib.transformer import EncoderDecoder
        model = EncoderDecoder(c['vocab'], 16, 2, c['layers'], c['layers'], 32, pad_id=None).double().eval()
        model.load_state_dict(c['model'])
        return sequential_loss(model, c['src'], c['tgt'], c['bos'])

    def reference(c):
        return gold(c)[1]
    check_cases('small model', params=[{'B': 2, 'S': 5, 'T': 4, 'vocab': 7, 'bos': 1, 'layers': 1}], make_case=make_case, submission=submission, reference=reference)

