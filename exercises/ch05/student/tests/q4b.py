from otter.test_files import test_case

OK_FORMAT = False

name = "q4b"
points = [0]

@test_case(points=None, hidden=False)
def test_q4b_public(hebbian_reads):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        length, dk, dv = (p['L'], p['d_k'], p['d_v'])
        return {'q': torch.randn(length, dk, dtype=torch.float64), 'k': torch.randn(length, dk, dtype=torch.float64), 'v': torch.randn(length, dv, dtype=torch.float64)}

    def submission(c):
        return hebbian_reads(c['q'], c['k'], c['v'])

    def reference(c):
        from xfam_lib.memory import NeuralMemory
        memory = NeuralMemory(c['k'].shape[1], 'hebbian', lr=1.0, d_value=c['v'].shape[1])
        return memory.scan(c['q'], c['k'], c['v'])
    check_cases('streams', params=[{'L': 1, 'd_k': 3, 'd_v': 2}, {'L': 4, 'd_k': 3, 'd_v': 3}, {'L': 6, 'd_k': 2, 'd_v': 4}], make_case=make_case, submission=submission, reference=reference)

