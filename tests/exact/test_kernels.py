"""The kernel objects (``svattn.exact.core.kernels.Kernel``): today's defaults and flags, the
core's formulas bit for bit as they were written before the objects (issue #38), the
registry, and a third kernel defined only in the tests (``tests/kernel_helpers.py``)
through the oracle, and where it stops: the SV memory's compiled backends."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kernel_helpers import TOY, registered
from svattn import SVDD
from svattn.exact import SVDDMemory
from svattn.exact.core.kernels import (
    KERNELS,
    LOG_MAX,
    ExpKernel,
    Kernel,
    KernelOverflowError,
    RBFKernel,
    _sq_dist_pairs,
    biased_softmax_readout,
    check_kernel,
    decision_values,
    default_gamma,
    get_kernel,
    gram_matrix,
    kernel_diag,
    kernel_matrix,
    kernel_names,
    log_kernel,
    register_kernel,
    sq_distances,
)
from svattn.exact.oracle import partition, solve_svdd


def _keys(seed, n=30, d=5, scale=0.8):
    return scale * np.random.default_rng(seed).normal(size=(n, d))


def test_registry_holds_the_two_kernels_under_their_names():
    assert KERNELS == kernel_names() == ("rbf", "exp")
    assert type(get_kernel("rbf")) is RBFKernel and type(get_kernel("exp")) is ExpKernel
    assert get_kernel(get_kernel("exp")) is get_kernel("exp")  # an object passes through


@pytest.mark.parametrize("dim", [1, 3, 8, 64])
def test_default_gamma_is_todays(dim):
    assert default_gamma("rbf", dim) == 1.0 / dim
    assert default_gamma("exp", dim) == 1.0 / math.sqrt(dim)
    with pytest.raises(ValueError, match="dim must be >= 1"):
        default_gamma("rbf", 0)


def test_flags_are_todays():
    rbf, exp = get_kernel("rbf"), get_kernel("exp")
    # the backends' is_rbf argument, k(x, x) = 1, k <= 1
    assert (rbf.compiled_flag, rbf.unit_diagonal, rbf.bounded) == (True, True, True)
    assert (exp.compiled_flag, exp.unit_diagonal, exp.bounded) == (False, False, False)
    assert rbf.dot_form(0.3) == (0.6, 0.3) and exp.dot_form(0.3) == (0.3, 0.0)
    assert rbf.diag_scale(0.3) == 0.0 and exp.diag_scale(0.3) == 0.3


def _old_log_kernel(x, y, kernel, gamma):
    """``log_kernel`` as written before the kernel objects."""
    if kernel == "rbf":
        sq = sq_distances(x, y)
        sq *= -gamma
        return sq
    out = x @ y.T
    out *= gamma
    return out


def _old_gram(x, kernel, gamma):
    """``gram_matrix`` as written before the kernel objects."""
    if kernel == "rbf":
        K = _sq_dist_pairs(np.ascontiguousarray(x, dtype=np.float64))
        K *= -gamma
        return np.exp(K, out=K)
    K = np.exp(_old_log_kernel(x, x, kernel, gamma))
    np.fill_diagonal(K, np.exp(gamma * np.einsum("ij,ij->i", x, x)))
    K += K.T
    K *= 0.5
    return K


@pytest.mark.parametrize("kernel", ["rbf", "exp"])
@pytest.mark.parametrize("m", [3, 40], ids=["narrow", "wide"])  # sq_distances' two loops
def test_core_formulas_are_the_old_ones_bit_for_bit(kernel, m):
    x, y, g = _keys(0), _keys(1, n=m), 0.37
    assert np.array_equal(log_kernel(x, y, kernel, g), _old_log_kernel(x, y, kernel, g))
    assert np.array_equal(kernel_matrix(x, y, kernel, g),
                          np.exp(_old_log_kernel(x, y, kernel, g)))
    old_diag = np.ones(len(x)) if kernel == "rbf" else np.exp(g * np.einsum("ij,ij->i", x, x))
    assert np.array_equal(kernel_diag(x, kernel, g), old_diag)
    assert np.array_equal(gram_matrix(y, kernel, g), _old_gram(y, kernel, g))


@pytest.mark.parametrize("kernel", ["rbf", "exp"])
def test_estimator_scores_are_the_old_formula_bit_for_bit(kernel):
    x, q = _keys(2, n=60), _keys(3, n=17)
    model = SVDD(C=0.1, kernel=kernel, gamma=0.3).fit(x)
    S, coef, g = model.support_vectors_, model.dual_coef_[0], model.gamma_
    dots, xx = np.einsum("ik,jk->ij", q, S), np.einsum("ij,ij->i", q, q)
    if kernel == "rbf":  # score_samples as written before the kernel objects
        d2 = xx[:, None] + np.einsum("ij,ij->i", S, S)[None, :] - 2.0 * dots
        old = np.einsum("ij,j->i", np.exp(-g * np.maximum(d2, 0.0)), coef)
    else:
        old = (np.einsum("ij,j->i", np.exp(g * dots), coef)
               - (np.exp(g * xx) - 1.0) / (2.0 * model.C_))
    assert np.array_equal(model.score_samples(q), old)


def test_overflow_rule_is_the_exp_kernels():
    big = np.full((2, 4), 20.0)  # gamma·x·y = 0.5·1600 = 800 > LOG_MAX ≈ 709.8
    assert 0.5 * 1600 > LOG_MAX
    with pytest.raises(KernelOverflowError, match="exp kernel overflows float64"):
        kernel_matrix(big, big, "exp", 0.5)
    with pytest.raises(KernelOverflowError, match="exp kernel overflows float64"):
        kernel_diag(big, "exp", 0.5)
    with pytest.raises(KernelOverflowError, match="exp kernel overflows float64"):
        SVDD(C=0.6, kernel="exp", gamma=0.5).fit(np.ones((2, 4))).score_samples(big)
    assert np.all(np.isfinite(kernel_matrix(big, -big, "rbf", 0.5)))  # bounded: no check
    get_kernel("rbf").check_overflow(1e9, "anything")  # a bounded kernel never raises


def test_unknown_names_and_bad_registrations_are_refused():
    for bad in ("foo", ["rbf"], 3, None):
        with pytest.raises(ValueError, match=r"kernel must be one of \('rbf', 'exp'\)"):
            get_kernel(bad)
        with pytest.raises(ValueError, match=r"kernel must be one of \('rbf', 'exp'\)"):
            check_kernel(bad)
    with pytest.raises(ValueError, match="'rbf' is already registered"):
        register_kernel(RBFKernel())
    with pytest.raises(TypeError, match="must be a Kernel"):
        register_kernel("rbf")
    assert kernel_names() == KERNELS  # nothing left behind


class _DotForm(ExpKernel):
    """``log k = s·x·y − c‖x‖² − c‖y‖²`` with ``(s, c) = (a·gamma, b·gamma)``."""

    def __init__(self, name, a, b):
        self.name, self.a, self.b = name, a, b

    def dot_form(self, gamma):
        return self.a * gamma, self.b * gamma


class _Anti(Kernel):
    """``k = exp(+gamma‖x − y‖²)``: not of the dot form, not positive definite."""

    name = "anti-rbf"

    def default_gamma(self, dim):
        return 1.0 / dim

    def log_kernel(self, x, y, gamma):
        return gamma * sq_distances(x, y)


class _Lopsided(_Anti):
    """``log k = −gamma‖x − y‖² + gamma·x_0``: not symmetric."""

    name = "lopsided"

    def log_kernel(self, x, y, gamma):
        return -gamma * sq_distances(x, y) + gamma * x[:, :1]


@pytest.mark.parametrize(("kernel", "why"), [
    (_DotForm("flipped-exp", -1.0, 0.0), r"dot form has s = -0\.01 < 0"),
    (_DotForm("rank-one", 0.0, 1.0), r"dot form has s = 0 = 0"),
    (_Anti(), r"Gram matrix has the eigenvalue -[0-9.e+]+ < 0"),
    (_Lopsided(), r"is not symmetric"),
], ids=["dot-form-s-negative", "dot-form-s-zero", "not-dot-form", "not-symmetric"])
def test_a_kernel_that_is_not_positive_definite_is_refused_at_registration(kernel, why):
    # register_kernel took any Kernel, and sv_attention then ran a non-PD kernel
    import torch

    from svattn.nn import sv_attention

    with pytest.raises(ValueError, match=f"kernel '{kernel.name}' is not positive definite: "
                                         f".*{why}"):
        register_kernel(kernel)
    assert kernel_names() == KERNELS  # nothing registered
    q = torch.randn(1, 1, 5, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="kernel must be one of"):
        sv_attention(q, q, q, C=0.5, kernel=kernel.name)


@pytest.mark.parametrize("kernel", [_DotForm("wide-damped", 1.0, -3.0), TOY],
                         ids=["dot-form-c-negative", "damped-exp"])
def test_a_positive_definite_kernel_is_registered(kernel):
    # s > 0 is the whole condition of the dot form: c of either sign keeps it PD
    with registered(kernel):
        assert kernel.name in kernel_names()
        x = _keys(9, n=25, d=3)
        assert np.linalg.eigvalsh(gram_matrix(x, kernel.name, 0.3))[0] > 0


def test_a_third_kernel_reaches_the_oracle():
    """One class (tests/kernel_helpers.py), registered: Gram matrix, diagonal, oracle
    solve, decision values and readout, with no library code edited."""
    x, q, g, C = _keys(4, n=40), _keys(5, n=9), 0.4, 0.1
    xx, qq = np.einsum("ij,ij->i", x, x), np.einsum("ij,ij->i", q, q)
    with registered() as toy:
        assert kernel_names() == (*KERNELS, toy.name)
        assert default_gamma(toy.name, 16) == 0.25
        K = gram_matrix(x, toy.name, g)
        direct = np.exp(g * (x @ x.T) - 0.25 * g * (xx[:, None] + xx[None, :]))
        np.testing.assert_allclose(K, direct, rtol=1e-13, atol=0)
        assert np.array_equal(K, K.T)
        assert np.array_equal(np.diag(K), np.exp(0.5 * g * xx))  # e = s − 2c = gamma/2
        np.testing.assert_allclose(kernel_matrix(q, x, toy.name, g),
                                   np.exp(g * (q @ x.T) - 0.25 * g * (qq[:, None] + xx)),
                                   rtol=1e-13, atol=0)
        alpha, mu = solve_svdd(K, C, return_mu=True)
        assert abs(alpha.sum() - 1.0) <= 1e-12 and alpha.min() >= 0 and alpha.max() <= C
        part = partition(alpha, C)
        assert part["margin"] and part["error"] and part["reserve"]
        f = decision_values(x, x, alpha, mu, toy.name, g)  # R² − ‖φ(x) − a‖², > 0 inside
        assert np.abs(f[part["margin"]]).max() <= 1e-9
        assert f[part["reserve"]].min() >= -1e-9 and f[part["error"]].max() <= 1e-9
        v = _keys(6, n=40, d=3)
        w = alpha[None, :] * kernel_matrix(q, x, toy.name, g)
        np.testing.assert_allclose(biased_softmax_readout(q, x, v, alpha, toy.name, g),
                                   (w @ v) / w.sum(1, keepdims=True), rtol=1e-12, atol=0)
    assert kernel_names() == KERNELS


def test_a_third_kernel_stops_at_the_memory_backends():
    """The SV memory's backends take the kernel as a flag (``is_rbf``) in ~12 compiled
    signatures and the reference backend's branches: a kernel without a compiled
    variant (``compiled_flag`` None) is refused there, with its name, not run as exp."""
    with registered(TOY):
        assert check_kernel(TOY.name) == TOY.name
        with pytest.raises(ValueError, match="no variant in the SV memory's backends"):
            check_kernel(TOY.name, compiled=True)
        for backend in ("compiled", "reference"):
            with pytest.raises(ValueError, match="no variant in the SV memory's backends"):
                SVDDMemory(0.1, kernel=TOY.name, backend=backend)
        with pytest.raises(ValueError, match="no variant in the SV memory's backends"):
            SVDD(C=0.1, kernel=TOY.name).fit(_keys(7))


class _DampedExp(ExpKernel):
    """exp's class with other formulas: it inherits ``compiled_flag`` False, the flag of
    exp's compiled variant, which computes exp's formulas, not these."""

    name = "damped-exp-subclass"

    def dot_form(self, gamma: float) -> tuple[float, float]:
        return gamma, 0.25 * gamma


class _ScaledRBF(RBFKernel):
    """rbf's class (``compiled_flag`` True) with another bandwidth convention."""

    name = "scaled-rbf-subclass"

    def log_kernel(self, x, y, gamma):
        return super().log_kernel(x, y, 2.0 * gamma)


@pytest.mark.parametrize("kernel", [_DampedExp(), _ScaledRBF()], ids=lambda k: k.name)
def test_a_subclass_of_a_builtin_does_not_borrow_its_compiled_variant(kernel):
    """A registered kernel whose ``compiled_flag`` it merely inherits (a subclass of rbf
    or exp with its own formulas) is refused by the memory's backends with its name,
    not run with the formulas of the built-in kernel that the flag selects."""
    with registered(kernel):
        assert check_kernel(kernel.name) == kernel.name  # the oracle and torch take it
        with pytest.raises(ValueError, match=f"kernel '{kernel.name}' has no variant"):
            check_kernel(kernel.name, compiled=True)
        for backend in ("compiled", "reference"):
            with pytest.raises(ValueError, match="no variant in the SV memory's backends"):
                SVDDMemory(0.1, kernel=kernel.name, gamma=0.4, backend=backend)
        with pytest.raises(ValueError, match="no variant in the SV memory's backends"):
            SVDD(C=0.1, kernel=kernel.name).fit(_keys(7))
