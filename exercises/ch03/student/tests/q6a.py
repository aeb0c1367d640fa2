from otter.test_files import test_case

OK_FORMAT = False

name = "q6a"
points = [0]

@test_case(points=None, hidden=False)
def test_q6a_public(tiled_attention):
    import math
    import torch
    import torch.nn.functional as F
    from xfam_grading import check_cases, output_problems

    def make_case(p):
        t, lead = (getattr(torch, p['dtype']), p['leading dims'])
        lq, lk, d, dv = (p['Lq'], p['Lk'], p['d'], p['d_v'])
        return {'block': p['block'], 'causal': p['causal'], 'budget': math.prod(lead) * lq * lk // 4, 'process': p['process'], 'q': torch.randn(*lead, lq, d, dtype=t), 'k': torch.randn(*lead, lk, d, dtype=t), 'v': torch.randn(*lead, lk, dv, dtype=t)}

    def submission(c):
        if c['process']:
            from xfam_grading import run_with_memory_budget
            run = run_with_memory_budget(lambda: tiled_attention(c['q'], c['k'], c['v'], block_size=c['block'], causal=c['causal']), c['budget'] * c['q'].element_size())
            return {'out': run['value'], 'process': {'over': run['over'], 'error': run['error']}}
        from torch.utils._python_dispatch import TorchDispatchMode
        from xfam_lib.bench import largest_intermediate

        class FusedAttentionSpy(TorchDispatchMode):
            """Records the ATen ops of fused attention kernels, if any are called."""

            def __init__(self):
                super().__init__()
                self.fused = set()

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = str(func)
                if 'scaled_dot_product' in name or 'flash_attention' in name or 'efficient_attention' in name:
                    self.fused.add(name)
                return func(*args, **kwargs or {})
        spy = FusedAttentionSpy()
        with spy:
            numel, shape, op = largest_intermediate(lambda: tiled_attention(c['q'], c['k'], c['v'], block_size=c['block'], causal=c['causal']), detail=True)
        out = tiled_attention(c['q'], c['k'], c['v'], block_size=c['block'], causal=c['causal'])
        return {'out': out, 'largest': {'numel': numel, 'shape': list(shape), 'op': op}, 'fused': sorted(spy.fused)}

    def reference(c):
        q, k, v = (c['q'].double(), c['k'].double(), c['v'].double())
        mask = None
        if c['causal']:
            lq, lk = (q.shape[-2], k.shape[-2])
            mask = torch.arange(lk) <= torch.arange(lq).unsqueeze(-1) + (lk - lq)
        outs = [F.scaled_dot_product_attention(q[..., i:i + 64, :], k, v, attn_mask=None if mask is None else mask[i:i + 64]) for i in range(0, q.shape[-2], 64)]
        return {'out': torch.cat(outs, dim=-2).to(c['q'].dtype)}

    def unrescaled(c, rescale_l):
        """The tiled loop with acc (and l unless rescale_l) never rescaled: a known mistake, in float64."""
        q, k, v, block = (c['q'].double(), c['k'].double(), c['v'].double(), c['block'])
        lq, lk = (q.shape[-2], k.shape[-2])
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if c['causal']:
            s = s.masked_fill(torch.arange(lk) > torch.arange(lq)[:, None] + (lk - lq), float('-inf'))
        m = torch.full(s.shape[:-1], float('-inf'), dtype=torch.float64)
        l, acc = (torch.zeros_like(m), torch.zeros(*m.shape, v.shape[-1], dtype=torch.float64))
        for j in range(0, lk, block):
            m_new = torch.maximum(m, s[..., j:j + block].amax(-1))
            shift = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            p = torch.exp(s[..., j:j + block] - shift[..., None])
            l = l * (torch.exp(m - shift) if rescale_l else 1.0) + p.sum(-1)
            acc, m = (acc + p @ v[..., j:j + block, :], m_new)
        return acc / torch.where(l > 0, l, torch.ones_like(l))[..., None]

    def compare(c, got, expected):
        if not isinstance(got, dict) or 'out' not in got:
            raise AssertionError(f'expected a dict with the output, got {type(got).__name__}')
        run = got.get('process')
        if run is not None:
            if run['error'] and (not run['over']):
                raise AssertionError(run['error'])
            if run['over']:
                lq, lk, size = (c['q'].shape[-2], c['k'].shape[-2], c['q'].element_size())
                raise AssertionError(f"over the memory budget: at Lq = {lq}, Lk = {lk} your code ran out of memory in a process allowed {c['budget'] * size / 2 ** 20:g} MiB beyond its inputs (a quarter of the {lq * lk * size / 2 ** 20:g} MiB score matrix): {run['error']}")
            problems = output_problems(got['out'], expected['out'], 'output')
            if problems:
                raise AssertionError('; '.join(problems))
            return
        problems = output_problems(got['out'], expected['out'], 'output')
        if problems and isinstance(got['out'], torch.Tensor) and (got['out'].shape == expected['out'].shape):
            problems += [why for why, rescale_l in (('acc is not rescaled by exp(m - m_new) when a key block raises the row maximum', True), ('neither acc nor l is rescaled by exp(m - m_new) when a key block raises the row maximum', False)) if torch.allclose(got['out'].double(), unrescaled(c, rescale_l), atol=0.0001)]
        if got.get('fused'):
            problems.append(f"your code called PyTorch's fused attention ({', '.join(got['fused'])}); compute the tiles yourself")
        largest = got.get('largest') or {}
        if not isinstance(largest.get('numel'), int) or largest['numel'] >= c['budget']:
            problems.append(f"over the memory budget: your code allocated a tensor of shape {largest.get('shape')} ({largest.get('numel')} elements, by {largest.get('op')}); the budget is fewer than {c['budget']} elements (a quarter of the score matrix)")
        if problems:
            raise AssertionError('; '.join(problems))
    check_cases('small', params=[{'leading dims': lead, 'Lq': lq, 'Lk': lk, 'd': d, 'd_v': dv, 'block': block, 'causal': causal, 'dtype': dtype, 'process': bool(process)} for lead, lq, lk, d, dv, block, causal, dtype, *process in (((1,), 128, 128, 8, 8, 32, False, 'float64'), ((1,), 96, 96, 8, 8, 32, True, 'float64'), ((1,), 40, 104, 8, 8, 24, True, 'float64'), ((2,), 64, 96, 8, 8, 32, True, 'float32'), ((1,), 512, 65536, 8, 8, 512, False, 'float32', True))], make_case=make_case, submission=submission, reference=reference, compare=compare)

