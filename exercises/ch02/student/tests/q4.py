from otter.test_files import test_case

OK_FORMAT = False

name = "q4"
points = [0]

@test_case(points=None, hidden=False)
def test_q4_public(online_normaliser, online_softmax):
    import torch
    from xfam_lib.grading import check_cases

    def make_case(p):
        return [float(v) for v in p]

    def submission(c):
        maxes, denominators = online_normaliser((v for v in c))
        return {'softmax': online_softmax((v for v in c)), 'maxes': maxes, 'denominators': denominators}

    def reference(c):
        x = torch.tensor(c, dtype=torch.float64)
        maxes = [float(x[:j + 1].max()) for j in range(len(c))]
        denominators = [float(torch.exp(x[:j + 1] - maxes[j]).sum()) for j in range(len(c))]
        return {'softmax': torch.softmax(x, 0), 'maxes': maxes, 'denominators': denominators}
    check_cases('small streams', params=[(1.0, 3.0, 2.0, 5.0), (1000.0, 1001.0, 1002.0)], make_case=make_case, submission=submission, reference=reference, isolated=False)

