from otter.test_files import test_case

OK_FORMAT = False

name = "q5b"
points = [0]

@test_case(points=None, hidden=False)
def test_q5b_public(selective_copy_batch):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        return dict(p)

    def submission(c):
        b, n, k, vocab, seed = (c['batch'], c['length'], c['n_data'], c['vocab'], c['seed'])
        inputs, targets = selective_copy_batch(b, n, k, vocab, torch.Generator().manual_seed(seed))
        again = selective_copy_batch(b, n, k, vocab, torch.Generator().manual_seed(seed))
        other = selective_copy_batch(b, n, k, vocab, torch.Generator().manual_seed(seed + 1))
        raised = []
        for args in ((1, n, n + 1, vocab), (1, n, 0, vocab)):
            try:
                selective_copy_batch(*args, torch.Generator().manual_seed(0))
                raised.append('nothing')
            except ValueError:
                raised.append('ValueError')
        return {'inputs': inputs, 'targets': targets, 'same seed': list(again), 'other seed': list(other), 'raises': raised}

    def reference(c):
        return None

    def compare(c, got, expected):
        b, n, k, vocab = (c['batch'], c['length'], c['n_data'], c['vocab'])
        x, y = (got['inputs'], got['targets'])
        for name, t in (('inputs', x), ('targets', y)):
            if not (isinstance(t, torch.Tensor) and tuple(t.shape) == (b, n + k) and (t.dtype == torch.long)):
                seen = f'shape {tuple(t.shape)}, dtype {t.dtype}' if isinstance(t, torch.Tensor) else type(t).__name__
                raise AssertionError(f'{name}: expected a torch.long tensor of shape {(b, n + k)}, got {seen}')
        problems = []
        ctx = x[:, :n]
        held = ctx != 0
        counts = held.sum(1).tolist()
        if any((m != k for m in counts)):
            r = next((r for r, m in enumerate(counts) if m != k))
            problems.append(f'row {r}: the first {n} positions hold {counts[r]} data tokens, expected {k} (PAD, 0, everywhere else)')
        if not bool(((ctx[held] >= 2) & (ctx[held] < vocab)).all()):
            problems.append(f'data tokens must be 2 .. {vocab - 1}, got {sorted(set(ctx[held].tolist()))}')
        if not bool((x[:, n:] == 1).all()):
            problems.append(f'positions {n} .. {n + k - 1} must hold the marker BOS (1), got {sorted(set(x[:, n:].flatten().tolist()))}')
        if bool((y[:, :n] != 0).any()):
            problems.append(f'targets must be PAD (0) on the first {n} positions, got {int((y[:, :n] != 0).sum())} non-PAD entries there')
        bad = [r for r in range(b) if y[r, n:].tolist() != ctx[r][held[r]].tolist()]
        if bad:
            r = bad[0]
            problems.append(f'row {r}: targets at the markers are {y[r, n:].tolist()}, expected the data tokens in order of position, {ctx[r][held[r]].tolist()}')
        same, other = (got['same seed'], got['other seed'])
        if not (len(same) == 2 and all((isinstance(t, torch.Tensor) for t in same)) and torch.equal(same[0], x) and torch.equal(same[1], y)):
            problems.append('the same seed gave another batch: draw every random number from `generator`')
        if b >= 16 and len(other) == 2 and isinstance(other[0], torch.Tensor) and torch.equal(other[0], x):
            problems.append('another seed gave the same batch')
        if b >= 16 and k < n and (len({tuple(r) for r in held.tolist()}) == 1):
            problems.append("every row puts its data at the same positions: draw each row's positions at random")
        if b >= 64:
            never = sorted(set(range(n)) - set(held.nonzero()[:, 1].tolist()))
            if never:
                problems.append(f'positions {never} never hold data in {b} rows: choose the positions uniformly among all {n}')
            missing = sorted(set(range(2, vocab)) - set(ctx[held].tolist()))
            if missing:
                problems.append(f'tokens {missing} never appear in {b} rows: draw the data uniformly from 2 .. {vocab - 1}')
        if got['raises'] != ['ValueError', 'ValueError']:
            problems.append(f"n_data > length, then n_data 0: expected ValueError both times, got {got['raises']}")
        if problems:
            raise AssertionError('; '.join(problems))
    check_cases('selective copies', params=[{'batch': 2, 'length': 8, 'n_data': 3, 'vocab': 10, 'seed': 0}, {'batch': 16, 'length': 12, 'n_data': 4, 'vocab': 12, 'seed': 1}, {'batch': 64, 'length': 10, 'n_data': 2, 'vocab': 8, 'seed': 2}], make_case=make_case, submission=submission, reference=reference, compare=compare)

