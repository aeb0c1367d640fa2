from otter.test_files import test_case

OK_FORMAT = False

name = "q3a"
points = [0]

@test_case(points=None, hidden=False)
def test_q3a_public(state_bytes):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        return dict(p, families=['softmax', 'sliding_window', 'linear', 'gla', 'performer', 's4d', 'mamba'])

    def submission(c):
        return {f: state_bytes(f, c['context'], c['d_model'], c['n_layers'], c['n_heads'], c['window'], c['n_features'], c['d_state'], c['bytes_per_value']) for f in c['families']}

    def reference(c):
        from xfam_lib.arena import ArenaLM, decode_state_bytes
        out = {}
        for f in c['families']:
            model = ArenaLM(f, 8, c['d_model'], c['n_layers'], n_heads=c['n_heads'], d_state=c['d_state'], window=c['window'], n_features=c['n_features'], max_len=8)
            out[f] = decode_state_bytes(model, c['context'], bytes_per_value=c['bytes_per_value'])
        return out
    check_cases('state table', params=[{'context': 5, 'd_model': 8, 'n_layers': 2, 'n_heads': 2, 'window': 3, 'n_features': 6, 'd_state': 4, 'bytes_per_value': 4}, {'context': 3, 'd_model': 12, 'n_layers': 1, 'n_heads': 3, 'window': 4, 'n_features': 8, 'd_state': 8, 'bytes_per_value': 2}], make_case=make_case, submission=submission, reference=reference)

