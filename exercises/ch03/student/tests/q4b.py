from otter.test_files import test_case

OK_FORMAT = False

name = "q4b"
points = [0]

@test_case(points=None, hidden=False)
def test_q4b_public(max_context):
    import torch
    from xfam_lib.bench import kv_cache_bytes as kv_cache_bytes_of_the_library
    from xfam_grading import check_cases
    dtypes = {1: torch.int8, 2: torch.bfloat16, 4: torch.float32}

    def make_case(p):
        return dict(p)

    def library_bytes(c, seq_len):
        return kv_cache_bytes_of_the_library(c['layers'], c['kv heads'], c['d_head'], seq_len, c['batch'], dtypes[c['bytes']])

    def submission(c):
        return max_context(c['memory'], c['layers'], c['kv heads'], c['d_head'], c['batch'], c['bytes'])

    def reference(c):
        return c['memory'] // library_bytes(c, 1)
    check_cases('budgets', params=[{'memory': 2 ** 30, 'layers': 32, 'kv heads': 8, 'd_head': 128, 'batch': 1, 'bytes': 2}, {'memory': 2 ** 30, 'layers': 32, 'kv heads': 8, 'd_head': 128, 'batch': 4, 'bytes': 2}, {'memory': 1000, 'layers': 2, 'kv heads': 4, 'd_head': 16, 'batch': 3, 'bytes': 4}], make_case=make_case, submission=submission, reference=reference)

