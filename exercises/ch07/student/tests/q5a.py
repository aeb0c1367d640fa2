from otter.test_files import test_case

OK_FORMAT = False

name = "q5a"
points = [0]

@test_case(points=None, hidden=False)
def test_q5a_public(blockwise):
    import math
    import torch
    from xfam_grading import check_cases, output_problems

    def make_case(p):
        lead, length, d = (p['leading dims'], p['L'], p['d'])
        checked = p['n_blocks'] >= 4 and 4 * (d + p['d_v']) <= length
        return {'n_blocks': p['n_blocks'], 'perm': p['perm'], 'budget': math.prod(lead) * length * length // 2 if checked else None, 'q': torch.randn(*lead, length, d, dtype=torch.float64), 'k': torch.randn(*lead, length, d, dtype=torch.float64), 'v': torch.randn(*lead, length, p['d_v'], dtype=torch.float64)}

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

        def run():
            perm = None if c['perm'] is None else list(c['perm'])
            return blockwise(c['q'], c['k'], c['v'], c['n_blocks'], perm)
        spy = FusedAttentionSpy()
        with spy:
            numel, shape, op = largest_intermediate(run, detail=True)
        return {'out': run(), 'largest': {'numel': numel, 'shape': list(shape), 'op': op}, 'fused': sorted(spy.fused)}

    def reference(c):
        from xfam_lib.sparse import blockwise_attention
        return {'out': blockwise_attention(c['q'], c['k'], c['v'], c['n_blocks'], c['perm'])}

    def compare(c, got, expected):
        if not isinstance(got, dict) or 'out' not in got:
            raise AssertionError(f'expected a dict with the output, got {type(got).__name__}')
        problems = output_problems(got['out'], expected['out'], 'output')
        if got.get('fused'):
            problems.append(f"your code called PyTorch's fused attention ({', '.join(got['fused'])}); compute the blocks yourself")
        largest = got.get('largest') or {}
        if c['budget'] is not None and (not isinstance(largest.get('numel'), int) or largest['numel'] >= c['budget']):
            problems.append(f"over the memory budget: your code allocated a tensor of shape {largest.get('shape')} ({largest.get('numel')} elements, by {largest.get('op')}); the budget is fewer than {c['budget']} elements (half the L x L score matrix)")
        if problems:
            raise AssertionError('; '.join(problems))

    def make_bad_case(p):
        return {'q': torch.randn(p['L'], 4, dtype=torch.float64), 'k': torch.randn(p['L'], 4, dtype=torch.float64), 'v': torch.randn(p['L'], 3, dtype=torch.float64), 'n_blocks': p['n_blocks']}

    def submission_bad(c):
        try:
            blockwise(c['q'], c['k'], c['v'], c['n_blocks'])
        except ValueError as exc:
            return {'raises': 'ValueError', 'message names n_blocks': 'n_blocks' in str(exc)}
        return {'raises': 'nothing', 'message names n_blocks': False}

    def reference_bad(c):
        return {'raises': 'ValueError', 'message names n_blocks': True}
    check_cases('small', params=[{'leading dims': lead, 'L': L, 'd': d, 'd_v': dv, 'n_blocks': n, 'perm': perm} for lead, L, d, dv, n, perm in (((1,), 64, 4, 4, 4, None), ((2,), 48, 4, 2, 6, (1, 2, 0, 4, 5, 3)), ((1,), 12, 3, 3, 3, (2, 0, 1)))], make_case=make_case, submission=submission, reference=reference, compare=compare)
    check_cases('n_blocks does not divide L', params=[{'L': L, 'n_blocks': n} for L, n in ((10, 4), (7, 2))], make_case=make_bad_case, submission=submission_bad, reference=reference_bad)

