from otter.test_files import test_case

OK_FORMAT = False

name = "q3b"
points = [0]

@test_case(points=None, hidden=False)
def test_q3b_public(kv_cache_crossover):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        return dict(p, families=['softmax', 'sliding_window', 'linear', 'gla', 'performer', 's4d', 'mamba'])

    def submission(c):
        return {f: kv_cache_crossover(f, c['d_model'], c['n_layers'], c['n_heads'], c['window'], c['n_features'], c['d_state']) for f in c['families']}

    def reference(c):
        from xfam_lib.arena import ArenaLM, decode_state_bytes
        sizes = dict(n_heads=c['n_heads'], d_state=c['d_state'], window=c['window'], n_features=c['n_features'], max_len=8)
        softmax = ArenaLM('softmax', 8, c['d_model'], c['n_layers'], **sizes)
        out = {}
        for f in c['families']:
            model = ArenaLM(f, 8, c['d_model'], c['n_layers'], **sizes)
            out[f] = next((L for L in range(1, 10000) if decode_state_bytes(softmax, L) > decode_state_bytes(model, L)), None)
        return out
    check_cases('crossovers', params=[{'d_model': 8, 'n_layers': 2, 'n_heads': 2, 'window': 3, 'n_features': 6, 'd_state': 4}, {'d_model': 12, 'n_layers': 1, 'n_heads': 3, 'window': 5, 'n_features': 8, 'd_state': 6}], make_case=make_case, submission=submission, reference=reference)

