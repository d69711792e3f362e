"""Complex decompositions on tpu against PyTorch's CPU results (issue 18): the QR family
(linalg.qr, geqrf, householder_product, ormqr: Q and R equal CPU's), the SVD and Hermitian
eigh (values equal CPU's; vectors unitary, reconstructing A, and equal to CPU's up to the
sign LAPACK's real bidiagonal / tridiagonal solver picks), and the general eigendecomposition
linalg.eig / eigvals of real and complex matrices (eigenvalues in CPU's order, eigenvectors
normalized as LAPACK's geev)."""
import pytest
import torch

from util import assert_same, check_op, crand, make

CDTYPES = [torch.complex64, torch.complex128]
TOL = {torch.complex64: dict(atol=2e-5, rtol=2e-5), torch.complex128: dict(atol=1e-11, rtol=1e-11),
       torch.float32: dict(atol=2e-5, rtol=2e-5), torch.float64: dict(atol=1e-11, rtol=1e-11)}

pytestmark = pytest.mark.usefixtures("highest_precision")


def zmake(shape, dtype, seed=0, noncontig=False):
    real = torch.float32 if dtype == torch.complex64 else torch.float64
    z = torch.complex(make(shape, real, seed=seed), make(shape, real, seed=seed + 100))
    if noncontig and z.dim() >= 2:
        z = z.transpose(-1, -2).contiguous().transpose(-1, -2)
    return z


def eye_like(n, ref):
    return torch.eye(n, dtype=ref.dtype).expand(*ref.shape[:-2], n, n)


# ------------------------------------------------------------------ QR family
@pytest.mark.parametrize("dtype", CDTYPES)
@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (4, 4), (2, 3, 3), (0, 3, 2)])
@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
def test_qr_equals_cpu(dtype, shape, mode):
    a = zmake(shape, dtype, seed=1, noncontig=True)
    q, r = check_op(lambda x: torch.linalg.qr(x, mode=mode), a, **TOL[dtype])
    if mode != "r" and a.numel():
        q, r = q.cpu(), r.cpu()
        torch.testing.assert_close(q @ r, a, **TOL[dtype])
        k = q.shape[-1]
        torch.testing.assert_close(q.mH @ q, eye_like(k, q), **TOL[dtype])
        d = torch.diagonal(r, dim1=-2, dim2=-1)
        assert (d.imag == 0).all()  # R's diagonal is real (beta of zlarfg)


@pytest.mark.parametrize("dtype", CDTYPES)
@pytest.mark.parametrize("shape", [(4, 4), (2, 5, 3), (2, 3, 5)])
def test_geqrf_householder_product(dtype, shape):
    a = zmake(shape, dtype, seed=2)
    refl, tau = check_op(torch.geqrf, a, **TOL[dtype])
    assert (tau.cpu().imag != 0).any()  # complex taus
    m, n = shape[-2:]
    if m >= n:
        check_op(torch.linalg.householder_product, refl.cpu(), tau.cpu(), **TOL[dtype])


@pytest.mark.parametrize("dtype", CDTYPES)
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("transpose", [True, False])
def test_ormqr(dtype, left, transpose):
    refl, tau = torch.geqrf(zmake((2, 5, 4), dtype, seed=3))
    c = zmake((2, 5, 3) if left else (2, 3, 5), dtype, seed=4)
    check_op(lambda r, t, x: torch.ormqr(r, t, x, left=left, transpose=transpose),
             refl, tau, c, **TOL[dtype])


def test_qr_family_dtype_mismatch():
    refl, tau = torch.geqrf(zmake((4, 3), torch.complex64))
    check_op(torch.linalg.householder_product, refl, tau.to(torch.complex128))


# ------------------------------------------------------------------ SVD
@pytest.mark.parametrize("dtype", CDTYPES)
@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (4, 4), (2, 6, 2), (0, 2, 2)])
@pytest.mark.parametrize("full", [True, False])
def test_svd(dtype, shape, full):
    a = zmake(shape, dtype, seed=5, noncontig=True)
    u, s, vh = torch.linalg.svd(a, full_matrices=full)
    ut, st, vht = (t.cpu() for t in torch.linalg.svd(a.to("tpu"), full_matrices=full))
    for t, c in ((ut, u), (st, s), (vht, vh)):
        assert (t.dtype, t.shape, t.stride()) == (c.dtype, c.shape, c.stride())
    torch.testing.assert_close(st, s, **TOL[dtype])
    if not a.numel():
        return
    k = s.shape[-1]
    torch.testing.assert_close((ut[..., :k] * st.to(dtype).unsqueeze(-2)) @ vht[..., :k, :], a,
                               **TOL[dtype])
    torch.testing.assert_close(ut.mH @ ut, eye_like(ut.shape[-1], ut), **TOL[dtype])
    torch.testing.assert_close(vht @ vht.mH, eye_like(vht.shape[-2], vht), **TOL[dtype])
    # the phase CPU's zgesdd leaves: the first row of the small factor is real, so the
    # vectors equal CPU's up to a sign per singular pair
    m, n = shape[-2:]
    small = ut[..., 0, :k] if m < n else vht[..., :k, 0]
    sign = torch.where(small.real * (u[..., 0, :k] if m < n else vh[..., :k, 0]).real < 0, -1, 1)
    torch.testing.assert_close(ut[..., :k] * sign.unsqueeze(-2), u[..., :k], **TOL[dtype])
    torch.testing.assert_close(vht[..., :k, :] * sign.unsqueeze(-1), vh[..., :k, :], **TOL[dtype])


@pytest.mark.parametrize("dtype", CDTYPES)
def test_svdvals_pinv_rank(dtype):
    a = zmake((3, 4, 3), dtype, seed=6)
    a[1] = a[1, :, :1] @ a[1, :1, :]  # rank 1
    check_op(torch.linalg.svdvals, a, **TOL[dtype])
    check_op(torch.linalg.pinv, a, atol=1e-4 if dtype == torch.complex64 else 1e-10, rtol=1e-4)
    check_op(torch.linalg.matrix_rank, a)
    check_op(lambda x: torch.linalg.matrix_norm(x, "nuc"), a, **TOL[dtype])


# ------------------------------------------------------------------ Hermitian eigh
def hermitian(shape, dtype, seed):
    a = zmake(shape, dtype, seed=seed)
    return a + a.mH


@pytest.mark.parametrize("dtype", CDTYPES)
@pytest.mark.parametrize("uplo", ["L", "U"])
@pytest.mark.parametrize("shape", [(1, 1), (4, 4), (3, 5, 5), (0, 3, 3)])
def test_eigh(dtype, uplo, shape):
    a = zmake(shape, dtype, seed=7)  # only the UPLO triangle is read
    h = torch.tril(a) if uplo == "L" else torch.triu(a)
    h = h + h.mH - torch.diag_embed(torch.diagonal(h, dim1=-2, dim2=-1).real.to(dtype))
    w, v = torch.linalg.eigh(a, UPLO=uplo)
    wt, vt = (t.cpu() for t in torch.linalg.eigh(a.to("tpu"), UPLO=uplo))
    assert (vt.dtype, vt.stride(), wt.dtype) == (v.dtype, v.stride(), w.dtype)
    torch.testing.assert_close(wt, w, **TOL[dtype])
    if not a.numel():
        return
    torch.testing.assert_close(h @ vt, vt * wt.to(dtype).unsqueeze(-2), **TOL[dtype])
    torch.testing.assert_close(vt.mH @ vt, eye_like(a.shape[-1], a), **TOL[dtype])
    # LAPACK's tridiagonal reduction leaves the first (L) / last (U) row real: the
    # vectors equal CPU's up to a sign per column
    row = 0 if uplo == "L" else -1
    assert (vt[..., row, :].imag == 0).all()
    sign = torch.where(vt[..., row, :].real * v[..., row, :].real < 0, -1, 1)
    torch.testing.assert_close(vt * sign.unsqueeze(-2), v, **TOL[dtype])


@pytest.mark.parametrize("dtype", CDTYPES)
def test_eigvalsh_and_hermitian_ops(dtype):
    h = hermitian((2, 5, 5), dtype, seed=8)
    check_op(torch.linalg.eigvalsh, h, **TOL[dtype])
    check_op(lambda x: torch.linalg.matrix_rank(x, hermitian=True), h)
    check_op(lambda x: torch.linalg.pinv(x, hermitian=True), h, atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------ general eig
def matrices(dtype, n, count, seed):
    g = torch.Generator().manual_seed(seed)
    real = {torch.complex64: torch.float32, torch.complex128: torch.float64}.get(dtype, dtype)
    for _ in range(count):
        a = torch.randn(n, n, generator=g, dtype=torch.float64)
        if dtype.is_complex:
            a = torch.complex(a, torch.randn(n, n, generator=g, dtype=torch.float64))
        yield a.to(dtype) if not dtype.is_complex else a.to(dtype), real


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_eig_equals_cpu(dtype, n):
    """Eigenvalues in CPU's order; complex input: eigenvectors equal CPU's (unit norm, largest
    entry real positive); real input: real eigenvectors equal CPU's (their sign from the Schur
    vectors), complex pairs up to a sign (dlartg's choice, see test_eig_real_pairs)."""
    tol = dict(atol=1e-9, rtol=1e-9)
    for a, _ in matrices(dtype, n, 6, seed=n):
        w, v = torch.linalg.eig(a)
        wt, vt = (t.cpu() for t in torch.linalg.eig(a.to("tpu")))
        assert (wt.dtype, vt.dtype, vt.stride()) == (w.dtype, v.dtype, v.stride())
        torch.testing.assert_close(wt, w, **tol)
        if dtype.is_complex:
            torch.testing.assert_close(vt, v, **tol)
        else:
            real = w.imag == 0
            torch.testing.assert_close(vt[:, real], v[:, real], **tol)
            sign = torch.where((vt.conj() * v).sum(0).real < 0, -1, 1)
            torch.testing.assert_close(vt * sign, v, **tol)
        ac = a.to(vt.dtype)
        torch.testing.assert_close(ac @ vt, vt * wt, **tol)
        torch.testing.assert_close(torch.linalg.vector_norm(vt, dim=0),
                                   torch.ones(n, dtype=w.real.dtype), **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64])
def test_eig_single_precision(dtype):
    """float32 / complex64 compute in double: the eigenvalues equal CPU's as a set (CPU's
    single-precision LAPACK may converge to another order), the vectors solve A v = w v."""
    for n in (1, 3, 6):
        for a, _ in matrices(dtype, n, 4, seed=20 + n):
            w = torch.linalg.eig(a)[0]
            wt, vt = (t.cpu() for t in torch.linalg.eig(a.to("tpu")))
            assert (wt.dtype, vt.dtype) == (w.dtype, w.dtype)
            key = lambda z: torch.sort(z.real * 1e3 + z.imag)[0]  # noqa: E731
            torch.testing.assert_close(key(wt), key(w), atol=1e-3, rtol=1e-4)
            torch.testing.assert_close(a.to(vt.dtype) @ vt, vt * wt, atol=1e-4, rtol=1e-4)


def test_eig_real_pairs():
    """The complex pairs of real matrices: dgeev turns each so its largest entry is real,
    with dlartg's sign; most (85% here) match CPU's exactly, the others are their negation."""
    same = total = 0
    for a, _ in matrices(torch.float64, 5, 30, seed=11):
        w, v = torch.linalg.eig(a)
        vt = torch.linalg.eig(a.to("tpu"))[1].cpu()
        for j in torch.nonzero(w.imag != 0).flatten().tolist():
            total += 1
            same += bool(torch.allclose(vt[:, j], v[:, j], atol=1e-9))
    assert total > 20 and same >= 0.85 * total


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64, torch.complex128])
@pytest.mark.parametrize("shape", [(4, 4), (2, 3, 3), (0, 3, 3), (0, 0)])
def test_eigvals(dtype, shape):
    a = make(shape, torch.float64, seed=12)
    a = (torch.complex(a, make(shape, torch.float64, seed=13)) if dtype.is_complex else a).to(dtype)
    check_op(torch.linalg.eigvals, a, **TOL[dtype])
    w, v = torch.linalg.eig(a.to("tpu"))
    assert w.dtype == (dtype if dtype.is_complex else dtype.to_complex())
    assert_same(w, torch.linalg.eig(a)[0], **TOL[dtype])


def test_eig_structured():
    """Matrices that balancing permutes (triangular, with isolated eigenvalues) and scales,
    and repeated eigenvalues."""
    cases = [torch.triu(make((5, 5), torch.float64, seed=14)),
             torch.tensor([[1.0, 1e6, 0.0], [1e-6, 2.0, 1e6], [0.0, 1e-6, 3.0]], dtype=torch.float64),
             torch.diag(torch.tensor([2.0, 2.0, -1.0], dtype=torch.float64)),
             torch.tensor([[0.0, -1.0], [1.0, 0.0]], dtype=torch.float64)]
    for a in cases:
        w, v = torch.linalg.eig(a)
        wt, vt = (t.cpu() for t in torch.linalg.eig(a.to("tpu")))
        torch.testing.assert_close(wt, w)
        torch.testing.assert_close(a.to(vt.dtype) @ vt, vt * wt)


def test_eig_errors():
    nan = torch.eye(3)
    nan[1, 2] = float("nan")
    for bad in (nan, torch.randn(3, 4), torch.randn(3)):
        check_op(torch.linalg.eig, bad)  # CPU raises: tpu raises the same type
    for bad in (torch.randn(3, 4), torch.randn(3)):
        check_op(torch.linalg.eigvals, bad)


def test_eig_backward():
    """PyTorch's formula (linalg_eig_backward) over tpu ops, complex solves included."""
    a = make((4, 4), torch.float64, seed=15)
    check_op(lambda x: torch.linalg.eigvals(x).abs(), a, grad=True, atol=1e-8, rtol=1e-8)


# ------------------------------------------------------------------ LDL^T
def ldl_cases(dtype, herm):
    """Symmetric (herm=False) or Hermitian matrices whose Bunch-Kaufman pivoting takes 1x1
    blocks, 2x2 blocks and interchanges, and one exactly singular matrix."""
    def sym(shape, seed):
        a = crand(shape, torch.complex128, seed=seed)
        return a + (a.mH if herm else a.mT)
    yield sym((3, 6, 6), 20).to(dtype)
    s = sym((2, 5, 5), 21)
    s[..., 0, 0] = 0.01  # a small leading diagonal: a 2x2 pivot first
    yield s.to(dtype)
    s = sym((7, 7), 22)
    s.diagonal().mul_(0.001)  # small diagonal throughout: 2x2 blocks and interchanges
    yield s.to(dtype)
    yield torch.tensor([[0, 1 + 2j], [1 + (-2 if herm else 2) * 1j, 0]], dtype=dtype)
    yield torch.zeros(3, 3, dtype=dtype)  # info 1, D(1,1) = 0


@pytest.mark.parametrize("dtype", CDTYPES)
@pytest.mark.parametrize("herm", [False, True])
def test_ldl_factor_and_solve(dtype, herm):
    for i, a in enumerate(ldl_cases(dtype, herm)):
        ld, piv, info = torch.linalg.ldl_factor_ex(a, hermitian=herm)
        if i == 2:
            assert (piv < 0).any()  # the case exercises 2x2 blocks on CPU
        ldt, pivt, infot = check_op(lambda x: torch.linalg.ldl_factor_ex(x, hermitian=herm), a,
                                    **TOL[dtype])
        assert torch.equal(pivt.cpu(), piv) and torch.equal(infot.cpu(), info)  # same pivots
        if info.any():
            continue
        b = crand(a.shape[:-1] + (3,), dtype, seed=23)
        x = check_op(lambda l, p, y: torch.linalg.ldl_solve(l, p, y, hermitian=herm), ld, piv, b,
                     atol=1e-4 if dtype == torch.complex64 else 1e-10, rtol=1e-4)
        # the factors solve A x = b: Hermitian matrices with hermitian=True, symmetric without
        torch.testing.assert_close(a @ x.cpu(), b, atol=1e-3 if dtype == torch.complex64 else 1e-9,
                                   rtol=0)


def test_ldl_hermitian_reads_lower_triangle_and_real_diagonal():
    a = crand((5, 5), torch.complex128, seed=24)  # neither symmetric nor Hermitian
    for herm in (False, True):
        check_op(lambda x: torch.linalg.ldl_factor(x, hermitian=herm), a, **TOL[torch.complex128])
    ld, piv = torch.linalg.ldl_factor(a.to("tpu"), hermitian=True)
    assert (torch.diagonal(ld.cpu()).imag == 0).all()


def test_ldl_errors():
    z = torch.zeros(2, 3, 3, dtype=torch.complex64)
    with pytest.raises(RuntimeError, match="ldl_factor"):
        torch.linalg.ldl_factor_ex(z.to("tpu"), check_errors=True)
        torch.tpu.synchronize()
    check_op(torch.linalg.ldl_factor, z)  # CPU raises for singular input: tpu the same type
    ld, piv = torch.linalg.ldl_factor(crand((3, 3), torch.complex64, seed=25))
    check_op(torch.linalg.ldl_solve, ld, piv, crand((3, 2), torch.complex128, seed=26))


# ------------------------------------------------------------------ least squares
LSTSQ_DRIVERS = ["gels", "gelsy", "gelsd", "gelss"]


@pytest.mark.parametrize("dtype", CDTYPES)
@pytest.mark.parametrize("driver", LSTSQ_DRIVERS)
@pytest.mark.parametrize("shapes", [((2, 5, 3), (2, 5, 2)), ((2, 3, 5), (2, 3, 2)), ((4, 4), (4,)),
                                    ((1, 5, 3), (2, 5, 2)), ((2, 5, 3), (2, 5)), ((0, 4, 3), (0, 4, 1))])
def test_lstsq(dtype, driver, shapes):
    a, b = crand(shapes[0], dtype, seed=30), crand(shapes[1], dtype, seed=31)
    r = check_op(lambda x, y: torch.linalg.lstsq(x, y, driver=driver), a, b,
                 atol=1e-4 if dtype == torch.complex64 else 1e-10, rtol=1e-4)
    # residuals and singular values are real, as CPU's
    assert not r.residuals.is_complex() and not r.singular_values.is_complex()


@pytest.mark.parametrize("dtype", CDTYPES)
@pytest.mark.parametrize("driver", ["gelsy", "gelsd", "gelss"])
def test_lstsq_rank_deficient(dtype, driver):
    a = crand((4, 4), torch.complex128, seed=32)
    a[:, 3] = a[:, 0] + 1j * a[:, 1]  # rank 3: the minimum-norm solution
    a, b = a.to(dtype), crand((4, 2), dtype, seed=33)
    tol = dict(atol=1e-3, rtol=1e-3) if dtype == torch.complex64 else dict(atol=1e-8, rtol=1e-8)
    check_op(lambda x, y: torch.linalg.lstsq(x, y, driver=driver), a, b, **tol)
    assert torch.linalg.lstsq(a.to("tpu"), b.to("tpu"), driver=driver).rank.item() == 3


@pytest.mark.parametrize("dtype", CDTYPES)
@pytest.mark.parametrize("shapes,driver", [(((2, 5, 3), (2, 5, 2)), None),
                                           (((2, 3, 5), (2, 3, 2)), "gelsd"),
                                           (((4, 4), (4,)), "gels")])
def test_lstsq_grad(dtype, shapes, driver):
    """PyTorch's backward formula (through pinv: the complex SVD) over tpu ops."""
    a, b = crand(shapes[0], dtype, seed=34), crand(shapes[1], dtype, seed=35)
    grads = []
    for dev in ("cpu", "tpu"):
        x, y = a.detach().to(dev).requires_grad_(), b.detach().to(dev).requires_grad_()
        s = torch.linalg.lstsq(x, y, driver=driver).solution
        s.backward(crand(s.shape, dtype, seed=36).to(dev))
        grads.append((x.grad.cpu(), y.grad.cpu()))
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.complex64 else TOL[dtype]
    torch.testing.assert_close(grads[1], grads[0], **tol)


def test_lstsq_errors():
    a = crand((5, 3), torch.complex64, seed=37)
    check_op(torch.linalg.lstsq, a, crand((5, 2), torch.complex128, seed=38))  # dtype mismatch
    check_op(torch.linalg.lstsq, a, crand((4, 2), torch.complex64, seed=38))  # rows differ
    z = torch.zeros(3, 3, dtype=torch.complex64)
    check_op(lambda x, y: torch.linalg.lstsq(x, y, driver="gels"), z, crand((3, 1), seed=39))
    # an all-zero A: LAPACK's gels returns the zero solution and zero residuals
    check_op(lambda x, y: torch.linalg.lstsq(x, y, driver="gels"), torch.zeros(4, 3), torch.ones(4, 1))
    # a singular A: CPU refuses, naming the zero diagonal entry of R
    s = crand((3, 3), torch.complex64, seed=40)
    s[:, 1] = 0
    check_op(lambda x, y: torch.linalg.lstsq(x, y, driver="gels"), s, crand((3, 1), seed=39))


def test_linalg_errors_are_linalg_errors():
    """Singular / not positive-definite input raises torch.linalg.LinAlgError, as on CPU."""
    z = torch.zeros(2, 3, 3, dtype=torch.complex64)
    for fn in (lambda x: torch.linalg.inv_ex(x, check_errors=True), torch.cholesky):
        with pytest.raises(torch.linalg.LinAlgError):
            fn(z)  # CPU
        with pytest.raises(torch.linalg.LinAlgError):
            fn(z.to("tpu"))
            torch.tpu.synchronize()
    # CPU's ldl_factor_ex(check_errors=True) raises a plain RuntimeError (an internal assert
    # on LAPACK's info); tpu's LinAlgError is one
    check_op(lambda x: torch.linalg.ldl_factor_ex(x, check_errors=True), z)
