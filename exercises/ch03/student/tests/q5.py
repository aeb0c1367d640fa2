from otter.test_files import test_case

OK_FORMAT = False

name = "q5"
points = [0]

@test_case(points=None, hidden=False)
def test_q5_public(repeat_kv, gqa_attention, tp_local_heads):
    import torch
    import torch.nn.functional as F
    from xfam_lib.grading import check_cases

    def make_case(p):
        h, h_kv, length = p
        return {'q': torch.randn(1, h, length, 4, dtype=torch.float64), 'k': torch.randn(1, h_kv, length, 4, dtype=torch.float64), 'v': torch.randn(1, h_kv, length, 4, dtype=torch.float64)}

    def submission(c):
        n_rep = c['q'].shape[1] // c['k'].shape[1]
        return {'repeat_kv': repeat_kv(c['k'], n_rep), 'gqa': gqa_attention(c['q'], c['k'], c['v']), 'tp_32_8_8': tuple(tp_local_heads(32, 8, 8))}

    def reference(c):
        n_rep = c['q'].shape[1] // c['k'].shape[1]
        return {'repeat_kv': c['k'].repeat_interleave(n_rep, dim=1), 'gqa': F.scaled_dot_product_attention(c['q'], c['k'], c['v'], enable_gqa=True), 'tp_32_8_8': (4, 1, 4)}
    check_cases('small', params=[(4, 2, 3)], make_case=make_case, submission=submission, reference=reference, isolated=False)

