from otter.test_files import test_case

OK_FORMAT = False

name = "q1b"
points = [0]

@test_case(points=None, hidden=False)
def test_q1b_public(encoder_layer_param_count):
    from torch import nn
    from xfam_grading import check_cases

    def make_case(p):
        return dict(p)

    def submission(c):
        return encoder_layer_param_count(c['d_model'], c['d_ff'])

    def reference(c):
        layer = nn.TransformerEncoderLayer(c['d_model'], 1, c['d_ff'], device='meta')
        return sum((t.numel() for t in layer.parameters()))
    check_cases('counts', params=[{'d_model': 8, 'd_ff': 16}, {'d_model': 30, 'd_ff': 7}], make_case=make_case, submission=submission, reference=reference)

