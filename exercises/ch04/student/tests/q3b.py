from otter.test_files import test_case

OK_FORMAT = False

name = "q3b"
points = [0]

@test_case(points=None, hidden=False)
def test_q3b_public(alibi_bias):
    import math
    import torch
    from xfam_grading import check_cases

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
        return {'n_heads': p['n_heads'], 'length': p['length'], 'scores': torch.randn(p['n_heads'], p['length'], p['length'], dtype=torch.float64)}

    def submission(c):
        import torch
        bias = alibi_bias(c['n_heads'], c['length'])
        causal = torch.ones(c['length'], c['length'], dtype=torch.bool).tril()
        shaped = isinstance(bias, torch.Tensor) and bias.shape == c['scores'].shape
        weights = torch.softmax((c['scores'] + bias.double()).masked_fill(~causal, float('-inf')), dim=-1) if shaped else bias
        return {'alibi_bias': bias, 'causal attention weights with the bias': weights.float() if shaped else weights}

    def reference(c):
        L, m = (c['length'], torch.tensor(slopes_rule(c['n_heads']), dtype=torch.float64))
        i, j = (torch.arange(L, dtype=torch.float64)[:, None], torch.arange(L, dtype=torch.float64)[None, :])
        paper = -m[:, None, None] * (i - j)
        causal = torch.ones(L, L, dtype=torch.bool).tril()
        weights = torch.softmax((c['scores'] + paper).masked_fill(~causal, float('-inf')), dim=-1)
        return {'alibi_bias': (-m[:, None, None] * (i - j).abs()).float(), 'causal attention weights with the bias': weights.float()}
    check_cases('biases', params=[{'n_heads': 8, 'length': 5}, {'n_heads': 12, 'length': 4}], make_case=make_case, submission=submission, reference=reference)

