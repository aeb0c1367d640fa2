from otter.test_files import test_case

OK_FORMAT = False

name = "q1a"
points = [0]

@test_case(points=None, hidden=False)
def test_q1a_public(mqar_batch):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        return dict(p)

    def submission(c):
        b, n, vocab, m, seed = (c['batch'], c['n_pairs'], c['vocab'], c['n_queries'], c['seed'])
        inputs, targets = mqar_batch(b, n, vocab, m, torch.Generator().manual_seed(seed))
        again = mqar_batch(b, n, vocab, m, torch.Generator().manual_seed(seed))
        other = mqar_batch(b, n, vocab, m, torch.Generator().manual_seed(seed + 1))
        stream = torch.Generator().manual_seed(seed)
        start = stream.get_state()
        first = mqar_batch(b, n, vocab, m, stream)
        advanced = not torch.equal(stream.get_state(), start)
        second = mqar_batch(b, n, vocab, m, stream)
        raised = []
        for args in ((1, n, vocab, n + 1), (1, (vocab - 2) // 2 + 1, vocab, 1)):
            try:
                mqar_batch(*args, torch.Generator().manual_seed(0))
                raised.append('nothing')
            except ValueError:
                raised.append('ValueError')
        return {'inputs': inputs, 'targets': targets, 'same seed': list(again), 'other seed': list(other), 'next draw': list(second), 'first draw': list(first), 'advanced': advanced, 'raises': raised}

    def reference(c):
        return None

    def compare(c, got, expected):
        b, n, vocab, m = (c['batch'], c['n_pairs'], c['vocab'], c['n_queries'])
        x, y = (got['inputs'], got['targets'])
        for name, t in (('inputs', x), ('targets', y)):
            if not (isinstance(t, torch.Tensor) and tuple(t.shape) == (b, 2 * n + m) and (t.dtype == torch.long)):
                seen = f'shape {tuple(t.shape)}, dtype {t.dtype}' if isinstance(t, torch.Tensor) else type(t).__name__
                raise AssertionError(f'{name}: expected a torch.long tensor of shape {(b, 2 * n + m)}, got {seen}')
        n_keys = (vocab - 2) // 2
        keys, values, queries = (x[:, 0:2 * n:2], x[:, 1:2 * n:2], x[:, 2 * n:])
        problems = []
        if not bool(((keys >= 2) & (keys < 2 + n_keys)).all()):
            problems.append(f'keys (positions 0, 2, 4, ...) must be tokens 2 .. {n_keys + 1}, got {sorted(set(keys.flatten().tolist()))}')
        if not bool(((values >= 2 + n_keys) & (values < vocab)).all()):
            problems.append(f'values (positions 1, 3, 5, ...) must be tokens {n_keys + 2} .. {vocab - 1}, got {sorted(set(values.flatten().tolist()))}')
        for r in range(b):
            if len(set(keys[r].tolist())) < n:
                problems.append(f'row {r}: a key repeats within the sequence: keys {keys[r].tolist()}')
                break
        for r in range(b):
            pairs = dict(zip(keys[r].tolist(), values[r].tolist()))
            asked = queries[r].tolist()
            if any((q not in pairs for q in asked)):
                problems.append(f'row {r}: the queries {asked} are not all keys of the row (keys {keys[r].tolist()})')
                break
            if len(set(asked)) < m:
                problems.append(f'row {r}: a query repeats: {asked}')
                break
            if y[r, 2 * n:].tolist() != [pairs[q] for q in asked]:
                problems.append(f'row {r}: targets at the queries are {y[r, 2 * n:].tolist()}, expected the paired values {[pairs[q] for q in asked]}')
                break
        if bool((y[:, :2 * n] != 0).any()):
            problems.append(f'targets must be PAD (0) on the context (positions 0 .. {2 * n - 1}), got {int((y[:, :2 * n] != 0).sum())} non-PAD entries there')
        same, other = (got['same seed'], got['other seed'])
        if not (len(same) == 2 and all((isinstance(t, torch.Tensor) for t in same)) and torch.equal(same[0], x) and torch.equal(same[1], y)):
            problems.append('the same seed gave another batch: draw every random number from `generator`')
        if b >= 16 and len(other) == 2 and isinstance(other[0], torch.Tensor) and torch.equal(other[0], x):
            problems.append('another seed gave the same batch')
        if not got['advanced']:
            problems.append('the call drew nothing from `generator` (its state did not change): draw every random number from it')
        nxt, first = (got['next draw'], got['first draw'])
        if b >= 16 and len(nxt) == 2 and (len(first) == 2) and all((isinstance(t, torch.Tensor) for t in nxt + first)) and torch.equal(nxt[0], first[0]):
            problems.append('two calls with the same generator gave the same batch: the second must continue drawing from it, not start again from its seed')

        def chi_square(counts, what):
            """Pearson's statistic against equal counts; over df + 6 sqrt(2 df): not uniform."""
            counts = counts.double()
            expected = counts.sum() / counts.numel()
            stat, df = (float(((counts - expected) ** 2 / expected).sum()), counts.numel() - 1)
            if df > 0 and stat > df + 6 * (2 * df) ** 0.5:
                problems.append(f'the {what} are not uniform over {b} rows (chi-square {stat:.1f} with {df} degrees of freedom; counts {counts.long().tolist()})')
        if b >= 256 and (not problems):
            chi_square(torch.bincount(keys.flatten() - 2, minlength=n_keys)[:n_keys], 'keys')
            n_values = vocab - 2 - n_keys
            chi_square(torch.bincount(values.flatten() - 2 - n_keys, minlength=n_values)[:n_values], 'values')
            slots = torch.tensor([keys[r].tolist().index(q) for r in range(b) for q in queries[r].tolist()])
            chi_square(torch.bincount(slots, minlength=n)[:n], 'queried pairs (by their place in the context)')
            firsts = torch.tensor([keys[r].tolist().index(int(queries[r, 0])) for r in range(b)])
            chi_square(torch.bincount(firsts, minlength=n)[:n], 'first queries (by their place in the context)')
        if b >= 16 and n < n_keys and (len({tuple(sorted(k)) for k in keys.tolist()}) == 1):
            problems.append(f"every row has the same keys {sorted(keys[0].tolist())}: draw each row's keys at random")
        if b >= 16 and m >= 2:
            where = [[keys[r].tolist().index(q) for q in queries[r].tolist()] for r in range(b)]
            if all((w == sorted(w) for w in where)):
                problems.append('every row asks its queries in the order of the context: ask them in random order')
        if b >= 64:
            missing = sorted(set(range(2, 2 + n_keys)) - set(keys.flatten().tolist()))
            if missing:
                problems.append(f'keys {missing} never appear in {b} rows: draw keys from all of 2 .. {n_keys + 1}')
            missing = sorted(set(range(2 + n_keys, vocab)) - set(values.flatten().tolist()))
            if missing:
                problems.append(f'values {missing} never appear in {b} rows: draw values uniformly from {n_keys + 2} .. {vocab - 1}')
            asked_pairs = {keys[r].tolist().index(q) for r in range(b) for q in queries[r].tolist()}
            if len(asked_pairs) < n:
                problems.append(f'only the pairs at indices {sorted(asked_pairs)} are ever queried: choose the queried keys at random among all {n} pairs')
        if got['raises'] != ['ValueError', 'ValueError']:
            problems.append(f"n_queries > n_pairs, then n_pairs > n_keys: expected ValueError both times, got {got['raises']}")
        if problems:
            raise AssertionError('; '.join(problems))
    check_cases('seeded batches', params=[{'batch': 2, 'n_pairs': 3, 'vocab': 12, 'n_queries': 3, 'seed': 0}, {'batch': 16, 'n_pairs': 4, 'vocab': 20, 'n_queries': 2, 'seed': 1}, {'batch': 64, 'n_pairs': 3, 'vocab': 14, 'n_queries': 2, 'seed': 2}, {'batch': 512, 'n_pairs': 4, 'vocab': 16, 'n_queries': 3, 'seed': 7}], make_case=make_case, submission=submission, reference=reference, compare=compare)

