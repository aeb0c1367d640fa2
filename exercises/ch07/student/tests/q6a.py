from otter.test_files import test_case

OK_FORMAT = False

name = "q6a"
points = [0]

@test_case(points=None, hidden=False)
def test_q6a_public(dca_positions):
    import torch
    from xfam_grading import check_cases

    def make_case(p):
        return dict(p)

    def submission(c):
        return dca_positions(c['L'], c['pretrain_len'], c['chunk'], c['local_window'])

    def reference(c):
        from xfam_lib.sparse import dca_position_matrix
        return dca_position_matrix(c['L'], c['pretrain_len'], c['chunk'], c['local_window'])
    check_cases('small sequences', params=[{'L': 12, 'pretrain_len': 10, 'chunk': 4, 'local_window': 2}, {'L': 13, 'pretrain_len': 9, 'chunk': 5, 'local_window': 3}, {'L': 4, 'pretrain_len': 8, 'chunk': 6, 'local_window': 2}, {'L': 9, 'pretrain_len': 7, 'chunk': 3, 'local_window': 0}, {'L': 10, 'pretrain_len': 6, 'chunk': 3, 'local_window': 3}], make_case=make_case, submission=submission, reference=reference)

