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
        return None

    def fits(c, n):
        return n == 0 or library_bytes(c, n) <= c['memory']

    def compare(c, got, expected):
        if not isinstance(got, int) or isinstance(got, bool) or got < 0:
            raise AssertionError(f'expected a number of tokens (an int >= 0), got {got!r}')
        if not fits(c, got):
            raise AssertionError(f"{got} tokens do not fit: their cache takes {library_bytes(c, got)} bytes, more than the {c['memory']} given")
        if fits(c, got + 1):
            raise AssertionError(f"{got + 1} tokens fit too ({library_bytes(c, got + 1)} of the {c['memory']} bytes): the answer is the longest context that fits")
    check_cases('budgets', params=[{'memory': 2 ** 30, 'layers': 32, 'kv heads': 8, 'd_head': 128, 'batch': 1, 'bytes': 2}, {'memory': 2 ** 30, 'layers': 32, 'kv heads': 8, 'd_head': 128, 'batch': 4, 'bytes': 2}, {'memory': 1000, 'layers': 2, 'kv heads': 4, 'd_head': 16, 'batch': 3, 'bytes': 4}], make_case=make_case, submission=submission, reference=reference, compare=compare)

