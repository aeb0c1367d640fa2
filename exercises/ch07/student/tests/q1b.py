from otter.test_files import test_case

OK_FORMAT = False

name = "q1b"
points = [0]

@test_case(points=None, hidden=False)
def test_q1b_public(fixed_pattern):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        return dict(p)

    def submission(c):
        masks = fixed_pattern(c['L'], c['stride'], c['c'])
        return {part: masks[part] for part in ('local', 'summary', 'union')}

    def reference(c):
        from xfam_lib.sparse import fixed_mask
        return {part: fixed_mask(c['L'], c['stride'], c['c'], part=part) for part in ('local', 'summary', 'union')}
    check_cases('small patterns', params=[{'L': 8, 'stride': 4, 'c': 1}, {'L': 10, 'stride': 4, 'c': 2}, {'L': 6, 'stride': 3, 'c': 3}], make_case=make_case, submission=submission, reference=reference)

