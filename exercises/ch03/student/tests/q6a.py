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
        return {'block': p['block'], 'causal': p['causal'], 'budget': math.prod(lead) * lq * lk // 4, 'q': torch.randn(*lead, lq, d, dtype=t), 'k': torch.randn(*lead, lk, d, dtype=t), 'v': torch.randn(*lead, lk, dv, dtype=t)}

    def submission(c):
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
        return {'out': F.scaled_dot_product_attention(q, k, v, attn_mask=mask).to(c['q'].dtype)}

    def compare(c, got, expected):
        if not isinstance(got, dict) or 'out' not in got:
            raise AssertionError(f'expected a dict with the output, got {type(got).__name__}')
        problems = output_problems(got['out'], expected['out'], 'output')
        if got.get('fused'):
            problems.append(f"your code called PyTorch's fused attention ({', '.join(got['fused'])}); compute the tiles yourself")
        largest = got.get('largest') or {}
        if not isinstance(largest.get('numel'), int) or largest['numel'] >= c['budget']:
            problems.append(f"over the memory budget: your code allocated a tensor of shape {largest.get('shape')} ({largest.get('numel')} elements, by {largest.get('op')}); the budget is fewer than {c['budget']} elements (a quarter of the score matrix)")
        if problems:
            raise AssertionError('; '.join(problems))
    check_cases('small', params=[{'leading dims': lead, 'Lq': lq, 'Lk': lk, 'd': d, 'd_v': dv, 'block': block, 'causal': causal, 'dtype': dtype} for lead, lq, lk, d, dv, block, causal, dtype in (((1,), 128, 128, 8, 8, 32, False, 'float64'), ((1,), 96, 96, 8, 8, 32, True, 'float64'), ((1,), 40, 104, 8, 8, 24, True, 'float64'))], make_case=make_case, submission=submission, reference=reference, compare=compare)

