from otter.test_files import test_case

OK_FORMAT = False

name = "q5"
points = [0]

@test_case(points=None, hidden=False)
def test_q5_public(KVCache, score_dot_products):
    import torch
    from xfam_lib.grading import check_cases
    from xfam_lib.transformer import TransformerLM

    def make_case(p):
        b, max_batch, chunks = p
        model = TransformerLM(13, 16, 2, 4, 2).double()
        return {'b': b, 'max_batch': max_batch, 'chunks': chunks, 'model': model, 'ids': torch.randint(0, 13, (b, sum(chunks)))}

    def submission(c):
        model, ids = (c['model'], c['ids'])
        caches = [KVCache(c['max_batch'], ids.shape[1], 2, 4, dtype=torch.float64) for _ in model.blocks]
        logits, pos = ([], 0)
        for n in c['chunks']:
            logits.append(model(ids[:, pos:pos + n], cache=caches))
            pos += n
        return {'logits': torch.cat(logits, dim=1), 'length': caches[0].length, 'counts_T3': score_dot_products(3)}

    def reference(c):
        return {'logits': c['model'](c['ids']), 'length': c['ids'].shape[1], 'counts_T3': (6, 14)}
    check_cases('prefill then decode', params=[(1, 1, (2, 1, 1))], make_case=make_case, submission=submission, reference=reference, isolated=False)

