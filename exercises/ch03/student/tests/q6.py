from otter.test_files import test_case

OK_FORMAT = False

name = "q6"
points = [0]

@test_case(points=None, hidden=False)
def test_q6_public(tiled_attention):
    import math
    import torch
    import torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode
    from xfam_lib.bench import largest_intermediate
    from xfam_lib.grading import check_cases, compare_outputs

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

    def make_case(p):
        lead, lq, lk, d, dv, block, causal, dtype = p
        t = getattr(torch, dtype)
        return {'block': block, 'causal': causal, 'budget': math.prod(lead) * lq * lk // 4, 'q': torch.randn(*lead, lq, d, dtype=t), 'k': torch.randn(*lead, lk, d, dtype=t), 'v': torch.randn(*lead, lk, dv, dtype=t)}

    def submission(c):
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
        compare_outputs(got['out'], expected['out'], where='output')
        if got['fused']:
            raise AssertionError(f"your code called PyTorch's fused attention ({', '.join(got['fused'])}); compute the tiles yourself")
        largest = got['largest']
        if largest['numel'] >= c['budget']:
            raise AssertionError(f"over the memory budget: your code allocated a tensor of shape {largest['shape']} ({largest['numel']} elements, by {largest['op']}); the budget is fewer than {c['budget']} elements (a quarter of the score matrix)")
    check_cases('small', params=[((1,), 128, 128, 8, 8, 32, False, 'float64'), ((1,), 96, 96, 8, 8, 32, True, 'float64')], make_case=make_case, submission=submission, reference=reference, compare=compare, isolated=False)

