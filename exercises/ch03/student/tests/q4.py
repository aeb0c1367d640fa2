from otter.test_files import test_case

OK_FORMAT = False

name = "q4"
points = [0]

@test_case(points=None, hidden=False)
def test_q4_public(kv_cache_bytes, max_context):
    from xfam_lib.grading import check_cases

    def submission(c):
        return {'llama3_8b_per_token': kv_cache_bytes(32, 8, 128, 1), 'mha_per_token': kv_cache_bytes(32, 32, 128, 1), 'llama3_8b_8192_tokens': kv_cache_bytes(32, 8, 128, 8192), 'tokens_in_1_GiB': max_context(2 ** 30, 32, 8, 128)}

    def reference(c):
        return {'llama3_8b_per_token': 131072, 'mha_per_token': 524288, 'llama3_8b_8192_tokens': 2 ** 30, 'tokens_in_1_GiB': 8192}
    check_cases('Llama-3-8B', params=[0], make_case=lambda p: p, submission=submission, reference=reference, isolated=False)

