from otter.test_files import test_case

OK_FORMAT = False

name = "q6a"
points = [0]

@test_case(points=None, hidden=False)
def test_q6a_public(knn_memory_attention):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        b, h, length, m, d = (p['B'], p['H'], p['L'], p['M'], p['d'])
        t = lambda n: torch.randn(b, h, n, d, dtype=torch.float64)
        mem_k = t(m) * torch.rand(b, h, m, 1, dtype=torch.float64).mul(2).add(0.2)
        return {'q': t(length), 'k': t(length), 'v': t(length), 'mem_k': mem_k, 'mem_v': t(m), 'topk': p['topk'], 'gate_logit': torch.tensor(p['gates'], dtype=torch.float64)}

    def submission(c):
        return knn_memory_attention(c['q'], c['k'], c['v'], c['mem_k'], c['mem_v'], c['topk'], c['gate_logit'])

    def reference(c):
        from xfam_lib.memory import knn_augmented_attention
        return knn_augmented_attention(c['q'], c['k'], c['v'], c['mem_k'], c['mem_v'], c['topk'], c['gate_logit'])
    check_cases('small memories', params=[{'B': 1, 'H': 2, 'L': 4, 'M': 10, 'd': 4, 'topk': 3, 'gates': [1.5, -0.5]}, {'B': 2, 'H': 1, 'L': 3, 'M': 5, 'd': 3, 'topk': 5, 'gates': [0.7]}, {'B': 1, 'H': 3, 'L': 5, 'M': 12, 'd': 2, 'topk': 2, 'gates': [-1.0, 0.3, 2.0]}], make_case=make_case, submission=submission, reference=reference)

