from otter.test_files import test_case

OK_FORMAT = False

name = "q1a"
points = [0]

@test_case(points=None, hidden=False)
def test_q1a_public(strided_pattern):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        return dict(p)

    def submission(c):
        masks = strided_pattern(c['L'], c['stride'])
        return {part: masks[part] for part in ('local', 'strided', 'union')}

    def reference(c):
        from xfam_lib.sparse import strided_mask
        return {part: strided_mask(c['L'], c['stride'], part=part) for part in ('local', 'strided', 'union')}
    check_cases('small patterns', params=[{'L': 8, 'stride': 3}, {'L': 10, 'stride': 4}, {'L': 5, 'stride': 1}, {'L': 4, 'stride': 6}], make_case=make_case, submission=submission, reference=reference)

