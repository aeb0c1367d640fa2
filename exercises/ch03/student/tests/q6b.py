from otter.test_files import test_case

OK_FORMAT = False

name = "q6b"
points = [0]

@test_case(points=None, hidden=False)
def test_q6b_public(flash_key_loop):
    import math
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        lead, lq, lk, d = (p['leading dims'], p['Lq'], p['Lk'], p['D'])
        q, k = (torch.randn(*lead, lq, d), torch.randn(*lead, lk, d))
        if p.get('growing maxima'):
            up = torch.ones(d) / math.sqrt(d)
            q = q + 2.0 * up
            k = k + 4.0 * torch.linspace(0, 1, lk)[:, None] * up
        return {'causal': p['causal'], 'q': q, 'k': k, 'v': torch.randn(*lead, lk, d)}

    def submission(c):
        import os
        import triton
        import triton.language as tl
        from xfam_grading import jit_body_problems
        problems = jit_body_problems(flash_key_loop, 'flash_key_loop')
        if problems:
            raise TypeError('; '.join(problems))
        import linecache
        source = '\n@triton.jit\ndef kernel(Q, K, V, O, LSE, len_q, len_k, qk_scale, KEY_LOOP: tl.constexpr, CAUSAL: tl.constexpr,\n           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):\n    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)\n    b, cols = tl.program_id(1), tl.arange(0, D)\n    tile = rows[:, None] * D + cols[None, :]\n    q = tl.load(Q + b * len_q * D + tile, mask=rows[:, None] < len_q, other=0.0)\n    acc, m, l = KEY_LOOP(q, K + b * len_k * D, V + b * len_k * D, rows, len_q, len_k, qk_scale,\n                         CAUSAL, BLOCK_M, BLOCK_N, D)\n    seen = l > 0.0\n    l_safe = tl.where(seen, l, 1.0)\n    tl.store(O + b * len_q * D + tile, acc / l_safe[:, None], mask=rows[:, None] < len_q)\n    tl.store(LSE + b * len_q + rows, tl.where(seen, m + tl.log2(l_safe), float("-inf")), mask=rows < len_q)\n'
        name = "<the q6b tests' kernel>"
        linecache.cache[name] = (len(source), None, source.splitlines(True), name)
        scope = {'triton': triton, 'tl': tl}
        exec(compile(source, name, 'exec'), scope)
        kernel = scope['kernel']
        lead, len_q, len_k, d = (c['q'].shape[:-2], c['q'].shape[-2], c['k'].shape[-2], c['q'].shape[-1])
        device = 'cpu' if os.environ.get('TRITON_INTERPRET') == '1' else 'cuda'
        q3, k3, v3 = (t.reshape(-1, t.shape[-2], d).to(device, torch.float32).contiguous() for t in (c['q'], c['k'], c['v']))
        out = torch.empty_like(q3)
        lse = torch.empty(q3.shape[:-1], dtype=torch.float32, device=device)
        try:
            kernel[triton.cdiv(len_q, 16), q3.shape[0]](q3, k3, v3, out, lse, len_q, len_k, 1 / math.log(2) / math.sqrt(d), KEY_LOOP=flash_key_loop, CAUSAL=c['causal'], BLOCK_M=16, BLOCK_N=16, D=d)
        except Exception as exc:
            while exc.__cause__ is not None:
                exc = exc.__cause__
            raise exc
        return {'out': out.reshape(*lead, len_q, d).cpu(), 'lse': lse.reshape(*lead, len_q).cpu()}

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

        def loop(base=2.0, rescale=True, shift=lk - lq, diagonal=True, ragged=True, transpose=True):
            if not transpose and q.shape[-1] != block:
                return torch.full_like(q, float('nan'))
            scores_of = s if transpose else torch.cat([q @ k[..., j:j + block, :] / math.sqrt(q.shape[-1]) / math.log(2) for j in range(0, lk + pad, block)], -1)
            visible = cols < (lk if ragged else lk + pad)
            if c['causal']:
                visible = visible & (cols <= rows + shift if diagonal else cols < rows + shift)
            scores = scores_of.masked_fill(~visible, float('-inf'))
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
        named = [('the scores are in base 2 (qk_scale holds log2 e): use tl.exp2, not tl.exp', {'base': math.e}), ('acc is not rescaled by 2 ** (m_old - m_new) when the maximum grows', {'rescale': False}), ("the keys past len_k (the last block's padding, read as 0) are not masked", {'ragged': False}), ('the scores are tl.dot(q, k): the keys must be transposed, tl.dot(q, tl.trans(k))', {'transpose': False})]
        if c['causal']:
            named += [('the causal mask hides the diagonal: key j is visible when j <= i + len_k - len_q', {'diagonal': False}), ('the causal mask is aligned top-left; align it bottom-right: j <= i + len_k - len_q', {'shift': 0})]
        out = got.get('out') if isinstance(got, dict) else None
        if not isinstance(out, torch.Tensor) or out.shape != q.shape:
            return []
        return [why for why, mistake in named if torch.allclose(out.double(), loop(**mistake), atol=0.0001)]
    check_cases('ragged, causal both ways', params=[{'leading dims': lead, 'Lq': lq, 'Lk': lk, 'D': d, 'causal': causal} for lead, lq, lk, d, causal in (((1,), 20, 50, 16, False), ((1,), 24, 40, 16, True), ((1,), 30, 20, 16, True))] + [{'leading dims': (1,), 'Lq': 20, 'Lk': 200, 'D': 16, 'causal': False, 'growing maxima': True}], make_case=make_case, submission=submission, reference=reference, compare=compare)

