from otter.test_files import test_case

OK_FORMAT = False

name = "q2a"
points = [0]

@test_case(points=None, hidden=False)
def test_q2a_public(compressive_update):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        b, d = (p['B'], p['d'])
        return {'mem': torch.randn(b, p['m'], d, dtype=torch.float64), 'cmem': torch.randn(b, p['cm'], d, dtype=torch.float64), 'h': torch.randn(b, p['L'], d, dtype=torch.float64), 'mem_len': p['mem_len'], 'cmem_len': p['cmem_len'], 'ratio': p['ratio']}

    def submission(c):
        new_mem, new_cmem = compressive_update(c['mem'], c['cmem'], c['h'], c['mem_len'], c['cmem_len'], c['ratio'])
        return {'mem': new_mem, 'cmem': new_cmem}

    def reference(c):
        from xfam_lib.memory import compress_pool, update_memories
        new_mem, new_cmem, _ = update_memories(c['mem'], c['cmem'], c['h'], c['mem_len'], c['cmem_len'], lambda x: compress_pool(x, c['ratio']))
        return {'mem': new_mem, 'cmem': new_cmem}
    check_cases('small memories', params=[{'B': 1, 'm': 4, 'cm': 1, 'L': 4, 'd': 2, 'mem_len': 4, 'cmem_len': 3, 'ratio': 2}, {'B': 2, 'm': 3, 'cm': 2, 'L': 4, 'd': 3, 'mem_len': 2, 'cmem_len': 3, 'ratio': 2}, {'B': 1, 'm': 2, 'cm': 1, 'L': 3, 'd': 2, 'mem_len': 6, 'cmem_len': 2, 'ratio': 3}, {'B': 1, 'm': 5, 'cm': 0, 'L': 2, 'd': 2, 'mem_len': 2, 'cmem_len': 4, 'ratio': 1}], make_case=make_case, submission=submission, reference=reference)

