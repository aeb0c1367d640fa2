from otter.test_files import test_case

OK_FORMAT = False

name = "q2b"
points = [0]

@test_case(points=None, hidden=False)
def test_q2b_public(orthogonal_gaussian_rows):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        return {'m': p['m'], 'd': p['d'], 'seed': p['seed']}

    def submission(c):
        m, d, seed = (c['m'], c['d'], c['seed'])
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            before = torch.get_rng_state()
            rows = orthogonal_gaussian_rows(m, d, seed)
            untouched = torch.equal(torch.get_rng_state(), before)
            torch.manual_seed(1)
            other_global = orthogonal_gaussian_rows(m, d, seed)
        return {'rows': rows, 'same seed': orthogonal_gaussian_rows(m, d, seed), 'other seed': orthogonal_gaussian_rows(m, d, seed + 1), 'global state untouched': untouched, 'other global state': other_global}

    def reference(c):
        return None

    def compare(c, got, expected):
        import math
        m, d, W = (c['m'], c['d'], got['rows'])
        if not (isinstance(W, torch.Tensor) and W.shape == (m, d) and (W.dtype == torch.float64)):
            seen = f'shape {tuple(W.shape)}, dtype {W.dtype}' if isinstance(W, torch.Tensor) else type(W).__name__
            raise AssertionError(f'rows: expected a float64 tensor of shape ({m}, {d}), got {seen}')
        problems = []
        if not torch.equal(W, got['same seed']):
            problems.append('the same seed gave other rows (draw every number from torch.Generator().manual_seed(seed))')
        if got['other seed'].shape == W.shape and torch.equal(W, got['other seed']):
            problems.append('another seed gave the same rows')
        if not got['global state untouched']:
            problems.append('the call changed the global random state (torch.manual_seed, or a draw without generator=): draw from your own torch.Generator only')
        elif not torch.equal(W, got['other global state']):
            problems.append('the rows depend on the global random state: pass generator= to every draw')
        unit = W / W.norm(dim=-1, keepdim=True)
        for start in range(0, m, d):
            block = unit[start:start + d]
            off = (block @ block.T - torch.eye(block.shape[0], dtype=torch.float64)).abs().max().item()
            if not off <= 1e-08:
                problems.append(f'rows {start}..{start + block.shape[0] - 1} (one block) are not orthogonal: largest |cos| between two of them is {off:.3g}')
                break
        if d >= 3 and m >= 2 * d:
            same = (unit[:d] * unit[d:2 * d]).sum(-1).abs().max().item()
            if not same <= 1 - 1e-06:
                problems.append(f'block 1 repeats the directions of block 0 (|cos| = {same:.8f})')
        squared = (W ** 2).sum(-1)
        if m >= 2 and (not squared.std().item() >= 0.001 * squared.mean().item()):
            problems.append(f'every row has the same squared length {squared.mean().item():.4g}: lengths must be drawn at random (chi-square with d degrees of freedom)')
        if m >= 1000:
            mean, var = (squared.mean().item(), squared.var().item())
            if not abs(mean - d) <= 6 * math.sqrt(2 * d / m):
                problems.append(f'squared lengths have mean {mean:.4g}, expected d = {d} (within {6 * math.sqrt(2 * d / m):.3g})')
            if not 0.5 * 2 * d <= var <= 1.5 * 2 * d:
                problems.append(f'squared lengths have variance {var:.4g}, expected 2d = {2 * d} (within 50%)')
        if problems:
            raise AssertionError('; '.join(problems))
    check_cases('orthogonal rows', params=[{'m': 10, 'd': 4, 'seed': 0}, {'m': 6, 'd': 3, 'seed': 2}, {'m': 4096, 'd': 8, 'seed': 1}], make_case=make_case, submission=submission, reference=reference, compare=compare)

