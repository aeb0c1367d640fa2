from otter.test_files import test_case

OK_FORMAT = False

name = "q4"
points = [0]

@test_case(points=None, hidden=False)
def test_q4_public(shift_right, teacher_forcing_loss, sequential_loss):
    import torch
    import torch.nn.functional as F
    from xfam_lib.grading import check_cases
    from xfam_lib.transformer import EncoderDecoder

    def make_case(p):
        b, s, t, vocab, bos = p
        model = EncoderDecoder(vocab, 16, 2, 1, 1, 32, pad_id=None).double()
        return {'bos': bos, 'model': model, 'src': torch.randint(2, vocab, (b, s)), 'tgt': torch.randint(2, vocab, (b, t))}

    def submission(c):
        m, src, tgt, bos = (c['model'], c['src'], c['tgt'], c['bos'])
        return {'shift_right': shift_right(tgt, bos), 'teacher_forcing_loss': teacher_forcing_loss(m, src, tgt, bos), 'sequential_loss': sequential_loss(m, src, tgt, bos)}

    def reference(c):
        tgt = c['tgt']
        tgt_in = torch.cat([torch.full((tgt.shape[0], 1), c['bos'], dtype=tgt.dtype), tgt[:, :-1]], dim=1)
        logits = c['model'](c['src'], tgt_in)
        loss = F.cross_entropy(logits.flatten(0, 1), tgt.flatten()).detach()
        return {'shift_right': tgt_in, 'teacher_forcing_loss': loss, 'sequential_loss': loss}
    check_cases('small model', params=[(2, 5, 4, 7, 1)], make_case=make_case, submission=submission, reference=reference, isolated=False)

