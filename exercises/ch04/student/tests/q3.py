from otter.test_files import test_case

OK_FORMAT = False

name = "q3"
points = [0]

@test_case(points=None, hidden=False)
def test_q3_public(alibi_slopes, alibi_bias):
    import math
    import torch
    from xfam_lib.grading import check_cases

    def slopes_rule(n):
        """The paper's code, re-typed: start = 2^(-2^-(log2 n - 3)), geometric; the interleaving rule otherwise."""

        def power_of_2(m):
            start = 2 ** (-2 ** (-(math.log2(m) - 3)))
            return [start * start ** i for i in range(m)]
        if math.log2(n).is_integer():
            return power_of_2(n)
        closest = 2 ** math.floor(math.log2(n))
        return power_of_2(closest) + slopes_rule(2 * closest)[0::2][:n - closest]

    def make_case(p):
        heads, length, slope_heads = p
        return {'heads': heads, 'length': length, 'slope_heads': slope_heads, 'scores': torch.randn(heads, length, length, dtype=torch.float64)}

    def attention_weights(c, bias):
        causal = torch.ones(c['length'], c['length'], dtype=torch.bool).tril()
        return torch.softmax((c['scores'] + bias.double()).masked_fill(~causal, float('-inf')), dim=-1)

    def submission(c):
        bias = alibi_bias(c['heads'], c['length'])
        return {'alibi_slopes': [alibi_slopes(n) for n in c['slope_heads']], 'alibi_bias': bias, 'causal attention weights with the bias': attention_weights(c, bias) if isinstance(bias, torch.Tensor) and bias.shape == (c['heads'], c['length'], c['length']) else bias}

    def reference(c):
        L, m = (c['length'], torch.tensor(slopes_rule(c['heads']), dtype=torch.float64))
        i, j = (torch.arange(L, dtype=torch.float64)[:, None], torch.arange(L, dtype=torch.float64)[None, :])
        paper = -m[:, None, None] * (i - j)
        return {'alibi_slopes': [torch.tensor(slopes_rule(n), dtype=torch.float32) for n in c['slope_heads']], 'alibi_bias': (-m[:, None, None] * (i - j).abs()).float(), 'causal attention weights with the bias': attention_weights(c, paper)}
    check_cases('8 heads', params=[(8, 5, (8,))], make_case=make_case, submission=submission, reference=reference, isolated=False)

