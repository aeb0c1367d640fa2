from otter.test_files import test_case

OK_FORMAT = False

name = "q6b"
points = [0]

@test_case(points=None, hidden=False)
def test_q6b_public(flash_key_loop, flash_attention_forward):
    import math
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        lead, lq, lk, d = (p['leading dims'], p['Lq'], p['Lk'], p['D'])
        return {'causal': p['causal'], 'q': torch.randn(*lead, lq, d), 'k': torch.randn(*lead, lk, d), 'v': torch.randn(*lead, lk, d)}

    def submission(c):
        try:
            out, lse = flash_attention_forward(c['q'], c['k'], c['v'], flash_key_loop, causal=c['causal'])
        except Exception as exc:
            while exc.__cause__ is not None:
                exc = exc.__cause__
            raise exc
        return {'out': out, 'lse': lse}

    def reference(c):
        q, k, v = (c['q'].double(), c['k'].double(), c['v'].double())
        lq, lk = (q.shape[-2], k.shape[-2])
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if c['causal']:
            s = s.masked_fill(torch.arange(lk) > torch.arange(lq)[:, None] + (lk - lq), float('-inf'))
        lse = torch.logsumexp(s, -1)
        weights = torch.exp(s - lse.unsqueeze(-1)).nan_to_num(0.0)
        return {'out': (weights @ v).float(), 'lse': (lse / math.log(2)).float()}

    def compare(c, got, expected):
        from xfam_grading import output_problems
        problems = output_problems(got, expected)
        if problems:
            raise AssertionError('; '.join(problems + mistakes(c, got)))

    def mistakes(c, got):
        """The known mistakes whose output the kernel reproduces (a float64 run of the loop)."""
        q, k, v = (c['q'].double(), c['k'].double(), c['v'].double())
        lq, lk, block = (q.shape[-2], k.shape[-2], 16)
        pad = -lk % block
        k, v = (torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (k, v))
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) / math.log(2)
        cols, rows = (torch.arange(lk + pad), torch.arange(lq)[:, None])

        def loop(base=2.0, rescale=True, shift=lk - lq, diagonal=True, ragged=True):
            visible = cols < (lk if ragged else lk + pad)
            if c['causal']:
                visible = visible & (cols <= rows + shift if diagonal else cols < rows + shift)
            scores = s.masked_fill(~visible, float('-inf'))
            m = torch.full(scores.shape[:-1], float('-inf'), dtype=torch.float64)
            l, acc = (torch.zeros_like(m), torch.zeros(*m.shape, v.shape[-1], dtype=torch.float64))
            for j in range(0, lk + pad, block):
                m_new = torch.maximum(m, scores[..., j:j + block].amax(-1))
                use = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
                p, alpha = (base ** (scores[..., j:j + block] - use[..., None]), base ** (m - use))
                l = l * alpha + p.sum(-1)
                acc = (acc * alpha[..., None] if rescale else acc) + p @ v[..., j:j + block, :]
                m = m_new
            return acc / torch.where(l > 0, l, torch.ones_like(l))[..., None]
        named = [('the scores are in base 2 (qk_scale holds log2 e): use tl.exp2, not tl.exp', {'base': math.e}), ('acc is not rescaled by 2 ** (m_old - m_new) when the maximum grows', {'rescale': False}), ("the keys past len_k (the last block's padding, read as 0) are not masked", {'ragged': False})]
        if c['causal']:
            named += [('the causal mask hides the diagonal: key j is visible when j <= i + len_k - len_q', {'diagonal': False}), ('the causal mask is aligned top-left; align it bottom-right: j <= i + len_k - len_q', {'shift': 0})]
        out = got.get('out') if isinstance(got, dict) else None
        if not isinstance(out, torch.Tensor) or out.shape != q.shape:
            return []
        return [why for why, mistake in named if torch.allclose(out.double(), loop(**mistake), atol=0.0001)]
    check_cases('ragged, causal both ways', params=[{'leading dims': lead, 'Lq': lq, 'Lk': lk, 'D': d, 'causal': causal} for lead, lq, lk, d, causal in (((1,), 20, 50, 16, False), ((1,), 24, 40, 16, True), ((1,), 30, 20, 16, True))], make_case=make_case, submission=submission, reference=reference, compare=compare)

    def launches_key_loop(c):
        other = flash_attention_forward.__globals__.get('load_rows')
        try:
            flash_attention_forward(c['q'], c['q'], c['q'], other, causal=False)
        except Exception:
            return {'breaks': True}
        return {'breaks': False}

    def launch_compare(c, got, expected):
        if got != expected:
            raise AssertionError('flash_attention_forward must launch flash_forward_kernel with key_loop as its inner loop (leave the given launch as it is): with another function passed as key_loop it still returned a result')
    check_cases('the launch runs your loop', params=[{'Lq': 20}], make_case=lambda p: {'q': torch.randn(1, p['Lq'], 16)}, submission=launches_key_loop, reference=lambda c: {'breaks': True}, compare=launch_compare)

