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
    check_cases('episodes', params=[{'shape': (2, 5, 3), 'rewards': 'random'}, {'shape': (4, 6, 2), 'rewards': 'terminal'}, {'shape': (1, 1, 4), 'rewards': 'random'}], make_case=make_case, submission=submission, reference=reference)

