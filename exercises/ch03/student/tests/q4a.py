from otter.test_files import test_case

OK_FORMAT = False

name = "q4a"
points = [0]

@test_case(points=None, hidden=False)
def test_q4a_public(kv_cache_bytes):
    import torch
    from xfam_lib.bench import kv_cache_bytes as kv_cache_bytes_of_the_library
    from xfam_grading import check_cases
    dtypes = {1: torch.int8, 2: torch.bfloat16, 4: torch.float32}

    def make_case(p):
        return dict(p)

    def library_bytes(c, seq_len):
        return kv_cache_bytes_of_the_library(c['layers'], c['kv heads'], c['d_head'], seq_len, c['batch'], dtypes[c['bytes']])

    def submission(c):
        return kv_cache_bytes(c['layers'], c['kv heads'], c['d_head'], c['tokens'], c['batch'], c['bytes'])

    def reference(c):
        return library_bytes(c, c['tokens'])
    check_cases('Llama-3-8B', params=[{'layers': 32, 'kv heads': 8, 'd_head': 128, 'tokens': 1, 'batch': 1, 'bytes': 2}, {'layers': 32, 'kv heads': 32, 'd_head': 128, 'tokens': 1, 'batch': 1, 'bytes': 2}, {'layers': 32, 'kv heads': 8, 'd_head': 128, 'tokens': 8192, 'batch': 1, 'bytes': 2}, {'layers': 32, 'kv heads': 8, 'd_head': 128, 'tokens': 100, 'batch': 3, 'bytes': 4}], make_case=make_case, submission=submission, reference=reference)

