from otter.test_files import test_case

OK_FORMAT = False

name = "q5a"
points = [0]

@test_case(points=None, hidden=False)
def test_q5a_public(delayed_copy):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        return dict(p)

    def submission(c):
        b, n, delay, vocab, seed = (c['batch'], c['length'], c['delay'], c['vocab'], c['seed'])
        inputs, targets = delayed_copy(b, n, delay, vocab, torch.Generator().manual_seed(seed))
        again = delayed_copy(b, n, delay, vocab, torch.Generator().manual_seed(seed))
        other = delayed_copy(b, n, delay, vocab, torch.Generator().manual_seed(seed + 1))
        raised = []
        for args in ((1, n, 0, vocab), (1, 0, delay, vocab), (1, n, delay, 2)):
            try:
                delayed_copy(*args, torch.Generator().manual_seed(0))
                raised.append('nothing')
            except ValueError:
                raised.append('ValueError')
        return {'inputs': inputs, 'targets': targets, 'same seed': list(again), 'other seed': list(other), 'raises': raised}

    def reference(c):
        return None

    def compare(c, got, expected):
        b, n, delay, vocab = (c['batch'], c['length'], c['delay'], c['vocab'])
        x, y = (got['inputs'], got['targets'])
        for name, t in (('inputs', x), ('targets', y)):
            if not (isinstance(t, torch.Tensor) and tuple(t.shape) == (b, n + delay) and (t.dtype == torch.long)):
                seen = f'shape {tuple(t.shape)}, dtype {t.dtype}' if isinstance(t, torch.Tensor) else type(t).__name__
                raise AssertionError(f'{name}: expected a torch.long tensor of shape {(b, n + delay)}, got {seen}')
        problems = []
        data = x[:, :n]
        if not bool(((data >= 2) & (data < vocab)).all()):
            problems.append(f'the first {n} positions must hold data tokens 2 .. {vocab - 1}, got {sorted(set(data.flatten().tolist()))}')
        if not bool((x[:, n:] == 1).all()):
            problems.append(f'positions {n} .. {n + delay - 1} must hold the marker BOS (1), got {sorted(set(x[:, n:].flatten().tolist()))}')
        if bool((y[:, :delay] != 0).any()):
            problems.append(f'targets must be PAD (0) before the first answer (positions 0 .. {delay - 1}), got {int((y[:, :delay] != 0).sum())} non-PAD entries there')
        bad = [r for r in range(b) if y[r, delay:].tolist() != x[r, :n].tolist()]
        if bad:
            r = bad[0]
            problems.append(f'row {r}: targets at positions {delay} .. {n + delay - 1} are {y[r, delay:].tolist()}, expected the inputs {delay} positions back, {x[r, :n].tolist()}')
        same, other = (got['same seed'], got['other seed'])
        if not (len(same) == 2 and all((isinstance(t, torch.Tensor) for t in same)) and torch.equal(same[0], x) and torch.equal(same[1], y)):
            problems.append('the same seed gave another batch: draw every random number from `generator`')
        if b >= 16 and len(other) == 2 and isinstance(other[0], torch.Tensor) and torch.equal(other[0], x):
            problems.append('another seed gave the same batch')
        if b >= 16 and len({tuple(r) for r in data.tolist()}) == 1:
            problems.append('every row holds the same tokens: draw each row at random')
        if b >= 64:
            missing = sorted(set(range(2, vocab)) - set(data.flatten().tolist()))
            if missing:
                problems.append(f'tokens {missing} never appear in {b} rows: draw the data uniformly from 2 .. {vocab - 1}')
        if got['raises'] != ['ValueError'] * 3:
            problems.append(f"delay 0, then length 0, then vocab 2 (no data token): expected ValueError each time, got {got['raises']}")
        if problems:
            raise AssertionError('; '.join(problems))
    check_cases('delayed copies', params=[{'batch': 2, 'length': 5, 'delay': 3, 'vocab': 10, 'seed': 0}, {'batch': 16, 'length': 8, 'delay': 8, 'vocab': 12, 'seed': 1}, {'batch': 64, 'length': 6, 'delay': 2, 'vocab': 8, 'seed': 2}], make_case=make_case, submission=submission, reference=reference, compare=compare)

