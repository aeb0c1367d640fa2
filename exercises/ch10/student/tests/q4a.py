from otter.test_files import test_case

OK_FORMAT = False

name = "q4a"
points = [0]

@test_case(points=None, hidden=False)
def test_q4a_public(reinforce_loss):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        B, T, A = p['shape']
        rewards = torch.randn(B, T, dtype=torch.float64)
        if p['rewards'] == 'terminal':
            rewards = torch.zeros(B, T, dtype=torch.float64)
            rewards[:, -1] = torch.randn(B, dtype=torch.float64).sign()
        return {'logits': torch.randn(B, T, A, dtype=torch.float64), 'values': torch.randn(B, T, dtype=torch.float64), 'actions': torch.randint(A, (B, T)), 'rewards': rewards}

    def submission(c):
        logits = c['logits'].clone().requires_grad_()
        values = c['values'].clone().requires_grad_()
        loss = reinforce_loss(logits, values, c['actions'], c['rewards'])
        d_logits, d_values = torch.autograd.grad(loss, (logits, values))
        return {'loss': loss.detach(), 'gradient of the logits': d_logits, 'gradient of the values': d_values}

    def reference(c):
        from xfam_lib.rl import reinforce_loss as library_loss
        logits = c['logits'].clone().requires_grad_()
        values = c['values'].clone().requires_grad_()
        loss = library_loss(logits, values, c['actions'], c['rewards'], value_coef=0.5, entropy_coef=0.0)
        d_logits, d_values = torch.autograd.grad(loss, (logits, values))
        return {'loss': loss.detach(), 'gradient of the logits': d_logits, 'gradient of the values': d_values}

    def compare(c, got, expected):
        from xfam_grading import output_problems
        problems = output_problems(got, expected)
        if problems:
            raise AssertionError('; '.join(problems + mistakes(c, got)))

    def mistakes(c, got):
        """The known mistakes whose loss and gradients the answer reproduces."""

        def loss(baseline=True):
            logits = c['logits'].clone().requires_grad_()
            values = c['values'].clone().requires_grad_()
            g = c['rewards'].flip(-1).cumsum(-1).flip(-1)
            logp = logits.log_softmax(-1).gather(-1, c['actions'].unsqueeze(-1)).squeeze(-1)
            weight = (g - values).detach() if baseline else g
            value = -(logp * weight).mean() + 0.5 * (g - values).pow(2).mean()
            return [value.detach(), *torch.autograd.grad(value, (logits, values))]
        if not isinstance(got, dict):
            return []
        mine = [got.get(k) for k in ('loss', 'gradient of the logits', 'gradient of the values')]
        if not all((isinstance(t, torch.Tensor) for t in mine)):
            return []
        named = [('the policy term uses the return G_t without subtracting the baseline: weight log pi by the advantage (G_t - V_t).detach()', {'baseline': False})]
        return [why for why, mistake in named if all((a.shape == b.shape and torch.allclose(a, b, atol=1e-08) for a, b in zip(mine, loss(**mistake))))]
    check_cases('episodes', params=[{'shape': (2, 5, 3), 'rewards': 'random'}, {'shape': (4, 6, 2), 'rewards': 'terminal'}, {'shape': (1, 1, 4), 'rewards': 'random'}], make_case=make_case, submission=submission, reference=reference, compare=compare)

