"""The dashboard's child-process runner (app/dashboard/background.py): results and exceptions come back
to the server."""

import os

import pytest
from warmscope.app.dashboard import background


@pytest.mark.slow
def test_result_comes_back_from_a_child_process():
    assert background.submit(divmod, 7, 2).result(120) == (3, 1)  # 7 = 3 × 2 + 1
    assert background.submit(os.getpid).result(120) != os.getpid()  # computed elsewhere


def test_exception_comes_back_as_raised():
    with pytest.raises(ValueError, match="invalid literal"):
        background.submit(int, "not a number").result(120)


def test_a_child_that_dies_is_an_error_not_a_hang():
    with pytest.raises(RuntimeError, match="ended early"):
        background.submit(os._exit, 3).result(120)


def test_a_child_whose_reader_is_gone_ends_quietly():
    """The page (or the server) stopped waiting: the child's result has nowhere to go. It ends
    with exit code 0; before, a BrokenPipeError traceback (twice) and exit code 1."""
    import multiprocessing

    from warmscope.app.dashboard.background import _child

    ctx = multiprocessing.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    recv.close()
    p = ctx.Process(target=_child, args=(send, sum, ([1, 2],)))
    p.start()
    send.close()
    p.join(60)
    assert p.exitcode == 0
