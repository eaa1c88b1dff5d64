"""Cone-aware equilibration, per-instance factorisation, and cones end to end:
training, serialisation, float32 and run-time checks."""

import pickle
import subprocess
import sys
import textwrap

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import pinet_eqx as pe
from pinet_eqx._linalg.equilibration import equilibrate_traced, group_labels
from pinet_eqx._projector.frozen import thaw
from pinet_eqx._solver import instance


def _mixed_constraints(rng, d=9):
    y0 = rng.uniform(-0.3, 0.3, size=d)
    A1 = rng.normal(size=(3, d)) * np.array([[1e-2], [1.0], [1e2]])
    A2 = rng.normal(size=(4, d))
    f = rng.normal(size=d)
    C = rng.normal(size=(2, d)) * 30.0
    return [
        pe.SecondOrderCone(A1, None, f, np.linalg.norm(A1 @ y0) - f @ y0 + 1.0),
        pe.SecondOrderCone(A2, None, None, np.linalg.norm(A2 @ y0) + 1.0),
        pe.L1NormCone(A2[:2], None, None, np.abs(A2[:2] @ y0).sum() + 1.0),
        pe.AffineInequality(C, C @ y0 - 1.0, C @ y0 + 1.0),
        pe.Simplex([0, 1], total=1.0),
    ]


def test_equilibration_gives_each_cone_block_one_scale():
    rng = np.random.default_rng(0)
    proj = pe.Projector(_mixed_constraints(rng))
    d_w = np.asarray(thaw(proj.op).d_w)
    assert proj.problem.n_ineq == 2
    box_scales, cone_scales = d_w[:2], d_w[2:]
    start = 0
    for group in proj.problem.groups:
        for _ in range(group.count):
            block = cone_scales[start : start + group.size]
            np.testing.assert_allclose(block, block[0], rtol=1e-14)
            start += group.size
    assert start == cone_scales.size
    # The blocks are not all scaled alike, and the box rows keep their own scales.
    assert np.ptp(cone_scales) > 1e-3 * cone_scales.max()
    assert box_scales[0] != box_scales[1]


def test_grouped_ruiz_host_and_traced_agree():
    rng = np.random.default_rng(1)
    M = rng.normal(size=(6, 9)) * np.logspace(-2, 2, 9)
    groups = np.array([0, 1, 2, 3, 4, 5, 5, 5, 7])
    d_r, d_c = pe.equilibrate(M, column_groups=groups)
    np.testing.assert_allclose(d_c[5:8], d_c[5], rtol=1e-14)
    labels, n_groups = group_labels(groups, 9)
    d_r_t, d_c_t = jax.jit(
        lambda M: equilibrate_traced(
            M,
            n_iter=25,
            tol=1e-3,
            mode="gauss_seidel",
            column_groups=jnp.asarray(labels),
            n_groups=n_groups,
        )
    )(jnp.asarray(M))
    np.testing.assert_allclose(d_r_t, d_r, rtol=1e-10)
    np.testing.assert_allclose(d_c_t, d_c, rtol=1e-10)
    # Balancing helps: the norms of the ungrouped columns spread far less than
    # before (a group can only balance its members' RMS).
    scaled = d_r[:, None] * M * d_c[None, :]
    alone = [0, 1, 2, 3, 4, 8]
    spread = np.ptp(np.log(np.linalg.norm(scaled[:, alone], axis=0)))
    assert spread < 0.2 * np.ptp(np.log(np.linalg.norm(M[:, alone], axis=0)))
    with pytest.raises(ValueError, match="column_groups"):
        pe.equilibrate(M, column_groups=groups[:-1])


@pytest.mark.slow  # 5000 iterations per instance at 1e-12: 25 s of the fast tier
def test_per_instance_scaling_is_applied_per_instance():
    """Two instances whose matrices differ by a column scaling of 10 get
    equilibration scalings that differ by the same factor, and both project
    accurately."""
    rng = np.random.default_rng(2)
    d = 6
    E = rng.normal(size=(2, d))
    scale = np.ones(d)
    scale[:3] = 10.0
    Es = jnp.asarray(np.stack([E, E * scale]))
    y_raw = jnp.asarray(rng.normal(size=(2, d)))
    qs = jnp.asarray(np.stack([E @ np.ones(d), E @ np.ones(d)]))
    proj = pe.Projector(
        [pe.Equality(pe.Parameter("E", shape=(2, d)), pe.Parameter("q"))],
        n_iter=5000,
        tol=1e-12,
        equilibrate=pe.Equilibration(y="per_column"),
    )
    problem = thaw(proj.problem)

    def factorise(E, q):
        data = problem.data({"E": E, "q": q}, E.dtype, True)
        return instance.factorise(proj, problem, data)

    ops = jax.vmap(factorise)(Es, qs)
    ratio = np.asarray(ops.d_y[0] / ops.d_y[1])
    # Scaling columns by 10 scales their equilibration factors by 1/10 relative
    # to the rest: the second instance is balanced as well as the first.
    np.testing.assert_allclose(ratio[:3] / ratio[3:].mean(), 10.0, rtol=0.05)
    y = jax.vmap(proj)(y_raw, E=Es, q=qs)
    # Equalities are exact at any iteration count; compare with the closed form.
    for i in range(2):
        Ei = np.asarray(Es[i])
        expected = y_raw[i] - Ei.T @ np.linalg.solve(Ei @ Ei.T, Ei @ y_raw[i] - qs[i])
        np.testing.assert_allclose(y[i], expected, atol=1e-9)


@pytest.mark.parametrize(
    "per_instance", [False, pytest.param(True, marks=pytest.mark.slow)]
)
def test_shared_y_scale_is_uniform_and_projects_the_same(per_instance):
    rng = np.random.default_rng(5)
    d = 7
    A = rng.normal(size=(3, d)) * np.logspace(-1, 1, d)[None, :]
    E = rng.normal(size=(2, d))
    y0 = rng.uniform(-0.3, 0.3, size=d)
    E_data = pe.Parameter("E", shape=(2, d)) if per_instance else E
    cons = [
        pe.SecondOrderCone(A, None, None, np.linalg.norm(A @ y0) + 0.3),
        pe.Equality(E_data, E @ y0),
    ]
    params = {"E": jnp.asarray(E)} if per_instance else {}
    y_raw = jnp.asarray(2 * rng.normal(size=d))
    outs = {}
    for mode in ("shared", "per_column"):
        proj = pe.Projector(
            cons, equilibrate=pe.Equilibration(y=mode), n_iter=20000, tol=1e-12
        )
        sol = proj.solve(y_raw, **params)
        assert sol.result == pe.RESULTS.successful
        outs[mode] = sol.y
        if not per_instance:
            d_y = np.asarray(thaw(proj.op).d_y)
            assert (np.ptp(d_y) == 0) == (mode == "shared")
    np.testing.assert_allclose(outs["shared"], outs["per_column"], atol=1e-9)


def _soc_net(key, d=6, k=3, n_ctx=4):
    """A net whose projector has a per-instance SOC matrix and offset."""
    proj = pe.Projector(
        [
            pe.SecondOrderCone(
                pe.Parameter("A", shape=(k, d)), pe.Parameter("a"), None, 1.0
            ),
            pe.Box(-2.0, 2.0 * np.ones(d)),
        ],
        n_iter=100,
        adjoint=pe.ImplicitAdjoint(on_failure="ignore"),
    )
    backbone = eqx.nn.Linear(n_ctx, d, key=key)
    return pe.HardConstrainedNet(backbone, proj)


@pytest.mark.slow
def test_training_through_per_instance_cone_reduces_loss_and_stays_feasible():
    key_net, key_data = jax.random.split(jax.random.key(0))
    net = _soc_net(key_net)
    n, d, k = 32, 6, 3
    X = jax.random.normal(key_data, (n, 4))
    As = jax.random.normal(jax.random.key(1), (n, k, d))
    offs = 0.1 * jax.random.normal(jax.random.key(2), (n, k))
    target = 3.0 * jnp.ones(d)

    def loss_fn(params, static):
        model = eqx.combine(params, static)
        Y = jax.vmap(model)(X, A=As, a=offs)
        return jnp.mean(jnp.sum((Y - target[None, :]) ** 2, axis=1))

    params, static = eqx.partition(net, pe.trainable_filter(net))
    optim = optax.adam(5e-2)
    opt_state = optim.init(params)

    @eqx.filter_jit
    def step(params, opt_state):
        loss, grads = jax.value_and_grad(loss_fn)(params, static)
        updates, opt_state = optim.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    losses = []
    for _ in range(25):
        params, opt_state, loss = step(params, opt_state)
        losses.append(float(loss))
    assert losses[-1] < 0.8 * losses[0]
    model = eqx.combine(params, static)
    Y = jax.vmap(model)(X, A=As, a=offs)
    viol = jax.vmap(model.projector.violation)(Y, A=As, a=offs)
    assert float(viol.max()) < 1e-3
    # And the cone is active: the target lies outside it, so the output is on it.
    norms = jnp.linalg.norm(jnp.einsum("nkd,nd->nk", As, Y) + offs, axis=1)
    assert float(jnp.max(jnp.abs(norms - 1.0))) < 1e-2


@pytest.mark.slow
def test_cone_projector_serialises_and_pickles(tmp_path):
    net = _soc_net(jax.random.key(3))
    path = tmp_path / "net.eqx"
    eqx.tree_serialise_leaves(path, net)
    loaded = eqx.tree_deserialise_leaves(path, _soc_net(jax.random.key(4)))
    unpickled = pickle.loads(pickle.dumps(net))
    x = jnp.ones(4)
    A = jnp.asarray(np.random.default_rng(0).normal(size=(3, 6)))
    a = jnp.zeros(3)
    expected = net(x, A=A, a=a)
    np.testing.assert_array_equal(loaded(x, A=A, a=a), expected)
    np.testing.assert_array_equal(unpickled(x, A=A, a=a), expected)


def test_rank_deficient_per_instance_equality_raises():
    d = 4
    proj = pe.Projector(
        [pe.Equality(pe.Parameter("E", shape=(2, d)), np.zeros(2))], n_iter=5
    )
    E = jnp.asarray([[1.0, 2.0, 0.0, 1.0], [2.0, 4.0, 0.0, 2.0]])
    with pytest.raises(Exception, match="linearly dependent"):
        proj(jnp.ones(d), E=E)


def test_negative_parameterised_simplex_total_raises():
    proj = pe.Projector(
        [pe.Simplex([0, 1, 2], total=pe.Parameter("r"))], n_iter=5, dim=3
    )
    with pytest.raises(Exception, match="lower > upper|empty"):
        proj(jnp.ones(3), r=jnp.asarray(-1.0))


@pytest.mark.slow
def test_float32_cone_projection(tmp_path):
    """Without x64, a mixed cone projection reaches float32-level accuracy."""
    script = textwrap.dedent(
        """
        import jax, jax.numpy as jnp, numpy as np
        import pinet_eqx as pe
        assert not jax.config.jax_enable_x64
        rng = np.random.default_rng(0)
        d = 10
        A = rng.normal(size=(4, d)); E = rng.normal(size=(3, d))
        y0 = rng.uniform(-0.3, 0.3, size=d)
        proj = pe.Projector(
            [
                pe.SecondOrderCone(A, None, None, np.linalg.norm(A @ y0) + 0.5),
                pe.Equality(pe.Parameter("E", shape=(3, d)), E @ y0),
                pe.Simplex([7, 8, 9], total=float(y0[7:].sum() + 1.0)),
            ],
            n_iter=500,
        )
        Y = jnp.asarray(rng.normal(size=(8, d)), jnp.float32) * 2
        Es = jnp.asarray(np.broadcast_to(E, (8, 3, d)), jnp.float32)
        sol = jax.jit(jax.vmap(proj.solve))(Y, E=Es)
        assert sol.y.dtype == jnp.float32, sol.y.dtype
        print(float(jnp.max(sol.primal_residual)))
        """
    )
    env = {"JAX_ENABLE_X64": "0", "JAX_PLATFORMS": "cpu", "PATH": ""}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    assert float(out.stdout.strip().splitlines()[-1]) < 5e-5
