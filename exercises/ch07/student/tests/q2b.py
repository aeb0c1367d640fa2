from otter.test_files import test_case

OK_FORMAT = False

name = "q2b"
points = [0]

@test_case(points=None, hidden=False)
def test_q2b_public(local_attention):
    import math
    import torch
    from xfam_grading import check_cases, output_problems

    def make_case(p):
        lead, length, d = (p['leading dims'], p['L'], p['d'])
        narrow = 4 * (p['block'] + 2 * p['window'] + d) <= length
        return {'window': p['window'], 'causal': p['causal'], 'block': p['block'], 'budget': math.prod(lead) * length * length // 4 if narrow else None, 'process': p['process'], 'q': torch.randn(*lead, length, d, dtype=torch.float64), 'k': torch.randn(*lead, length, d, dtype=torch.float64), 'v': torch.randn(*lead, length, p['d_v'], dtype=torch.float64)}

    def submission(c):
        if c['process']:
            from xfam_grading import run_with_memory_budget
            run = run_with_memory_budget(lambda: local_attention(c['q'], c['k'], c['v'], c['window'], causal=c['causal'], block_size=c['block']), c['budget'] * c['q'].element_size())
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

        def run():
            return local_attention(c['q'], c['k'], c['v'], c['window'], causal=c['causal'], block_size=c['block'])
        spy = FusedAttentionSpy()
        with spy:
            numel, shape, op = largest_intermediate(run, detail=True)
        return {'out': run(), 'largest': {'numel': numel, 'shape': list(shape), 'op': op}, 'fused': sorted(spy.fused)}

    def reference(c):
        from xfam_lib.sparse import sliding_window_attention
        return {'out': sliding_window_attention(c['q'], c['k'], c['v'], c['window'], causal=c['causal'])}

    def compare(c, got, expected):
        if not isinstance(got, dict) or 'out' not in got:
            raise AssertionError(f'expected a dict with the output, got {type(got).__name__}')
        run = got.get('process')
        if run is not None:
            if run['error'] and (not run['over']):
                raise AssertionError(run['error'])
            if run['over']:
                length, size = (c['q'].shape[-2], c['q'].element_size())
                raise AssertionError(f"over the memory budget: at L = {length} your code ran out of memory in a process allowed {c['budget'] * size / 2 ** 20:g} MiB beyond its inputs (a quarter of the {length * length * size / 2 ** 20:g} MiB score matrix): {run['error']}")
            problems = output_problems(got['out'], expected['out'], 'output')
            if problems:
                raise AssertionError('; '.join(problems))
            return
        problems = output_problems(got['out'], expected['out'], 'output')
        if got.get('fused'):
            problems.append(f"your code called PyTorch's fused attention ({', '.join(got['fused'])}); compute the chunks yourself")
        largest = got.get('largest') or {}
        if c['budget'] is not None and (not isinstance(largest.get('numel'), int) or largest['numel'] >= c['budget']):
            problems.append(f"over the memory budget: your code allocated a tensor of shape {largest.get('shape')} ({largest.get('numel')} elements, by {largest.get('op')}); the budget is fewer than {c['budget']} elements (a quarter of the L x L score matrix)")
        if problems:
            raise AssertionError('; '.join(problems))
    check_cases('small', params=[{'leading dims': lead, 'L': L, 'd': d, 'd_v': dv, 'window': w, 'causal': causal, 'block': block, 'process': bool(process)} for lead, L, d, dv, w, causal, block, *process in (((1,), 128, 8, 8, 4, False, 16), ((1,), 120, 8, 4, 3, True, 16), ((2,), 20, 4, 4, 0, False, 8), ((1,), 21, 4, 4, 2, True, 4), ((1,), 16384, 8, 8, 16, False, 256, True))], make_case=make_case, submission=submission, reference=reference, compare=compare)

