"""The host solves' worker processes (`_linalg.host_processes`): the scheduler
on its own, and the sparse polish in processes against its threads."""

from __future__ import annotations

import contextlib
import operator
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_grids import _far_instances, _solve, grid, grid_projector

import pinet_eqx as pe
from pinet_eqx._linalg import host_processes
from pinet_eqx._linalg.host_solve import FACTORISATIONS


@contextlib.contextmanager
def _workers(enabled: bool, count: int = 2):
    """Processes on (with `count` workers, whatever this machine's cores) or off;
    the pool's state restored after."""
    saved = os.environ.get(host_processes.ENVIRONMENT)
    pool_size = host_processes.pool_size
    os.environ[host_processes.ENVIRONMENT] = "1" if enabled else "0"
    host_processes.pool_size = lambda: count
    try:
        yield
    finally:
        host_processes.pool_size = pool_size
        host_processes._shutdown()
        host_processes._BROKEN = False
        if saved is None:
            del os.environ[host_processes.ENVIRONMENT]
        else:
            os.environ[host_processes.ENVIRONMENT] = saved


def test_tasks_wait_until_ready_and_results_come_back():
    """Each task starts only once `ready` says so (here: after the one before
    it), receives the context built in the worker, and its result reaches
    `done`."""
    results: dict[int, int] = {}
    started: list[int] = []

    def task(i):
        started.append(i)
        return operator.add, (i,)

    with _workers(True, count=3):
        ran = host_processes.run(
            6, b"ten", (operator.pos, (10,)), task,
            lambda i: i == 0 or i - 1 in results, results.__setitem__,
        )  # fmt: skip
    assert ran
    assert started == list(range(6))
    assert results == {i: 10 + i for i in range(6)}


def test_a_failing_task_raises_with_the_workers_traceback():
    with _workers(True), pytest.raises(RuntimeError, match="ZeroDivisionError"):
        host_processes.run(
            4, b"one", (operator.pos, (1,)), lambda i: (operator.truediv, (0,)),
            lambda i: True, lambda i, r: None,
        )  # fmt: skip


def test_a_task_that_can_never_start_is_an_error():
    with _workers(True), pytest.raises(RuntimeError, match="never runs"):
        host_processes.run(
            4, b"one", (operator.pos, (1,)), lambda i: (operator.add, (i,)),
            lambda i: i < 2, lambda i, r: None,
        )  # fmt: skip


def _polish_batch():
    """A case118 batch far outside the set (30 times the spread), with close
    loads: the polish's neighbours' faces are taken. Returns the outputs and
    the host factorisations counted."""
    case = grid("case118")
    proj = grid_projector(case, inference=True)
    Y, p_d = _far_instances(case, 8, 30.0)
    FACTORISATIONS.reset()
    sol = _solve(proj, Y, case.q(p_d))
    return np.asarray(sol.y), np.asarray(sol.result._value), FACTORISATIONS.reset()


def test_polish_in_processes_is_the_polish_in_threads():
    """The same batch in two worker processes and in threads: the same outputs to
    the bit, the same results and the same count of host factorisations (the
    workers' counted in the caller's)."""
    with _workers(True):
        y_proc, result_proc, count_proc = _polish_batch()
        assert host_processes._WORKERS, "the batch did not run in processes"
    with _workers(False):
        y_thread, result_thread, count_thread = _polish_batch()
    np.testing.assert_array_equal(y_proc, y_thread)
    np.testing.assert_array_equal(result_proc, result_thread)
    assert count_proc == count_thread > 0


def test_dead_workers_leave_the_batch_to_threads():
    """Workers killed between two batches: the second runs in threads, with the
    same outputs, and the workers are not tried again."""
    with _workers(True):
        y_first, _, _ = _polish_batch()
        for worker in host_processes._WORKERS:
            worker.process.kill()
            worker.process.wait()
        y_second, result, _ = _polish_batch()
        assert host_processes._BROKEN
        assert not host_processes.wanted(100)
    np.testing.assert_array_equal(y_first, y_second)
    assert np.all(result == pe.RESULTS.successful._value)


def test_workers_import_this_package_whatever_the_working_directory(tmp_path):
    """A caller whose working directory holds another `pinet_eqx` (a checkout
    beside the installed one): the workers still import the caller's package,
    so the batch runs in them."""
    fake = tmp_path / "pinet_eqx"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('the wrong copy')\n")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        with _workers(True):
            results: dict[int, int] = {}
            ran = host_processes.run(
                4, b"two", (operator.pos, (2,)), lambda i: (operator.add, (i,)),
                lambda i: True, results.__setitem__,
            )  # fmt: skip
    finally:
        os.chdir(cwd)
    assert ran
    assert results == {i: 2 + i for i in range(4)}


def _gradient_batch():
    """The derivative of a case118 batch of 8 in training mode (each instance
    its own face's saddle-point system, `_linalg.host_saddle`): the gradient of
    a fixed linear function of the outputs with respect to the raw outputs."""
    case = grid("case118")
    proj = grid_projector(case)
    Y, p_d = _far_instances(case, 8, 3.0)
    w = np.random.default_rng(3).normal(size=Y.shape)

    def value(Y):
        return jnp.sum(w * jax.vmap(lambda y, q: proj(y, q=q))(Y, case.q(p_d)))

    return np.asarray(jax.grad(value)(jnp.asarray(Y)))


def test_derivative_in_processes_is_the_derivative_in_threads():
    """The training-mode derivative's face solves in two worker processes and
    in threads: the same gradient to the bit."""
    with _workers(True):
        g_proc = _gradient_batch()
        assert host_processes._WORKERS, "the batch did not run in processes"
    with _workers(False):
        g_thread = _gradient_batch()
    assert np.abs(g_thread).max() > 0
    np.testing.assert_array_equal(g_proc, g_thread)
