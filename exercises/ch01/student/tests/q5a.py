from otter.test_files import test_case

OK_FORMAT = False

name = "q5a"
points = [0, 0]

@test_case(points=None, hidden=False)
def test_q5a_public(KVCache):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        b = p['B']
        return {'b': b, 'writes': [(start, torch.randn(b, 2, n, 4, dtype=torch.float64), torch.randn(b, 2, n, 4, dtype=torch.float64)) for start, n in p['writes']]}

    def submission(c):
        import torch
        cache = KVCache(3, 8, 2, 4, dtype=torch.float64)
        steps = []
        for start, k, v in c['writes']:
            k_all, v_all = cache.update(k, v, start)
            steps.append({'k': k_all.clone() if isinstance(k_all, torch.Tensor) else k_all, 'v': v_all.clone() if isinstance(v_all, torch.Tensor) else v_all, 'length': cache.length})
        try:
            cache.update(torch.zeros(c['b'], 2, 7, 4, dtype=torch.float64), torch.zeros(c['b'], 2, 7, 4, dtype=torch.float64), cache.length)
            overflow = 'no error'
        except Exception as exc:
            overflow = type(exc).__name__
        return {'steps': steps, 'overflow (length + 7 > max_len 8)': overflow}

    def reference(c):
        k_buf = torch.zeros(c['b'], 2, 8, 4, dtype=torch.float64)
        v_buf = torch.zeros_like(k_buf)
        steps = []
        for start, k, v in c['writes']:
            end = start + k.shape[2]
            k_buf[:, :, start:end], v_buf[:, :, start:end] = (k, v)
            steps.append({'k': k_buf[:, :, :end].clone(), 'v': v_buf[:, :, :end].clone(), 'length': end})
        return {'steps': steps, 'overflow (length + 7 > max_len 8)': 'ValueError'}
    check_cases('update contract', params=[{'B': 2, 'writes': ((0, 3), (3, 1), (4, 2), (2, 1))}], make_case=make_case, submission=submission, reference=reference)

@test_case(points=None, hidden=False)
def test_q5a_public_with_a_model(KVCache):
    import torch
    from xfam_grading import check_cases
    from xfam_lib.transformer import TransformerLM

    def make_case(p):
        model = TransformerLM(13, 16, 2, 4, 2).double()
        return {'max_batch': p['max_batch'], 'chunks': p['chunks'], 'room': p.get('room', 0), 'model': model.state_dict(), 'ids': torch.randint(0, 13, (p['B'], sum(p['chunks'])))}

    def submission(c):
        import torch
        from xfam_lib.transformer import TransformerLM
        model = TransformerLM(13, 16, 2, 4, 2).double().eval()
        model.load_state_dict(c['model'])
        ids = c['ids']
        caches = [KVCache(c['max_batch'], ids.shape[1] + c['room'], 2, 4, dtype=torch.float64) for _ in model.blocks]
        logits, pos = ([], 0)
        with torch.no_grad():
            for n in c['chunks']:
                logits.append(model(ids[:, pos:pos + n], cache=caches))
                pos += n
        cache = caches[0]
        length = cache.length
        extra = torch.zeros(ids.shape[0], 2, cache.max_len - cache.length + 1, 4, dtype=torch.float64)
        try:
            cache.update(extra, extra, cache.length)
            overflow = 'no error'
        except Exception as exc:
            overflow = type(exc).__name__
        return {'logits': torch.cat(logits, dim=1), 'cache length': length, 'one write too many': overflow}

    def reference(c):
        model = TransformerLM(13, 16, 2, 4, 2).double().eval()
        model.load_state_dict(c['model'])
        with torch.no_grad():
            return {'logits': model(c['ids']), 'cache length': c['ids'].shape[1], 'one write too many': 'ValueError'}
    check_cases('prefill then decode', params=[{'B': 1, 'max_batch': 1, 'chunks': (2, 1, 1)}], make_case=make_case, submission=submission, reference=reference)

