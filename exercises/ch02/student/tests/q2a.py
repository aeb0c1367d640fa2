from otter.test_files import test_case

OK_FORMAT = False

name = "q2a"
points = [0]

@test_case(points=None, hidden=False)
def test_q2a_public(equivariance_error):
    import torch
    from xfam_lib.attention import MultiHeadAttention
    from xfam_grading import check_cases, compare_outputs

    def make_case(p):
        attn = MultiHeadAttention(p['d'], p['heads']).double()
        perm = torch.randperm(p['L'])
        return {'d': p['d'], 'heads': p['heads'], 'attn': attn.state_dict(), 'perm': perm, 'x': torch.randn(p['B'], p['L'], p['d'], dtype=torch.float64)}

    def submission(c):
        import torch
        from xfam_lib.attention import MultiHeadAttention
        attn = MultiHeadAttention(c['d'], c['heads']).double().eval()
        attn.load_state_dict(c['attn'])
        maps = {'attention': attn, 'causal attention': lambda t: attn(t, causal=True), 'running sum': lambda t: t.cumsum(1)}
        with torch.no_grad():
            return {name: equivariance_error(f, c['x'], c['perm']) for name, f in maps.items()}

    def reference(c):
        attn = MultiHeadAttention(c['d'], c['heads']).double().eval()
        attn.load_state_dict(c['attn'])
        maps = {'attention': attn, 'causal attention': lambda t: attn(t, causal=True), 'running sum': lambda t: t.cumsum(1)}
        x, perm = (c['x'], c['perm'])
        with torch.no_grad():
            return {name: float((f(x[:, perm]) - f(x)[:, perm]).abs().max()) for name, f in maps.items()}

    def compare(c, got, expected):
        tiny = {k: v for k, v in got.items() if isinstance(v, float) and v < 1e-10} if isinstance(got, dict) else {}
        if isinstance(got, dict) and isinstance(got.get('attention'), float) and (not got['attention'] <= 1e-10):
            raise AssertionError(f"attention: it is equivariant, so the error must be about 1e-16, got {got['attention']:.3g}")
        compare_outputs(dict(got, **{k: 0.0 for k in tiny}) if isinstance(got, dict) else got, {k: v if v >= 1e-10 else 0.0 for k, v in expected.items()})
    check_cases('three maps', params=[{'B': 2, 'L': 5, 'd': 8, 'heads': 2}], make_case=make_case, submission=submission, reference=reference, compare=compare)

