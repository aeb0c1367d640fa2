from otter.test_files import test_case

OK_FORMAT = False

name = "q1a"
points = [0]

@test_case(points=None, hidden=False)
def test_q1a_public(xl_memory_update):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        b, m, length, d = (p['B'], p['m'], p['L'], p['d'])
        return {'mem': torch.randn(b, m, d, dtype=torch.float64), 'h': torch.randn(b, length, d, dtype=torch.float64), 'mem_len': p['mem_len'], 'no memory yet': p['mem'] == 'None'}

    def submission(c):
        h = c['h'].clone().requires_grad_(True)
        out = xl_memory_update(None if c['no memory yet'] else c['mem'], h, c['mem_len'])
        return {'memory': out.detach(), 'gradient stopped': not out.requires_grad}

    def reference(c):
        from xfam_lib.memory import update_xl_memory
        mem = None if c['no memory yet'] else c['mem']
        return {'memory': update_xl_memory(mem, c['h'], c['mem_len']), 'gradient stopped': True}
    check_cases('small memories', params=[{'B': 1, 'm': 2, 'L': 3, 'd': 4, 'mem_len': 4, 'mem': 'tensor'}, {'B': 2, 'm': 0, 'L': 3, 'd': 2, 'mem_len': 2, 'mem': 'None'}, {'B': 1, 'm': 3, 'L': 2, 'd': 3, 'mem_len': 8, 'mem': 'tensor'}, {'B': 2, 'm': 4, 'L': 2, 'd': 3, 'mem_len': 3, 'mem': 'tensor'}], make_case=make_case, submission=submission, reference=reference)

