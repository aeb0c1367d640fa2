from otter.test_files import test_case

OK_FORMAT = False

name = "q4"
points = [0]

@test_case(points=None, hidden=False)
def test_q4_public(relative_position_bucket):
    import math
    import torch
    from xfam_grading import check_cases

    def loop(rel, bidirectional, num_buckets, max_distance):
        """The published rule, one Python int at a time."""
        bucket, n = (0, -rel)
        if bidirectional:
            num_buckets //= 2
            bucket += num_buckets if n < 0 else 0
            n = abs(n)
        else:
            n = max(n, 0)
        max_exact = num_buckets // 2
        if n < max_exact:
            return bucket + n
        large = max_exact + int(math.log(n / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact))
        return bucket + min(large, num_buckets - 1)

    def make_case(p):
        if p['offsets'] == 'the table above':
            rel = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 20, 50, 100, 200])
        elif p['offsets'] == '-300 ... 300':
            rel = torch.arange(-300, 301)
        else:
            rel = torch.arange(40)[None, :] - torch.arange(30)[:, None]
        return {'rel': rel, 'args': (p['bidirectional'], p['num_buckets'], p['max_distance'])}

    def submission(c):
        b, nb, md = c['args']
        return relative_position_bucket(c['rel'].clone(), bidirectional=b, num_buckets=nb, max_distance=md)

    def reference(c):
        flat = [loop(int(r), *c['args']) for r in c['rel'].flatten()]
        return torch.tensor(flat, dtype=torch.int64).view(c['rel'].shape)
    check_cases("the chapter's table and both rules", params=[{'offsets': 'the table above', 'bidirectional': True, 'num_buckets': 32, 'max_distance': 128}, {'offsets': '-300 ... 300', 'bidirectional': True, 'num_buckets': 32, 'max_distance': 128}, {'offsets': '-300 ... 300', 'bidirectional': False, 'num_buckets': 32, 'max_distance': 128}], make_case=make_case, submission=submission, reference=reference)

