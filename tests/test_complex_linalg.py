"""Complex (complex64 / complex128) dense linear algebra on tpu against PyTorch's CPU
results.

Part 1: LU (factor, solve, inverse, det, slogdet, unpack), Cholesky of Hermitian
matrices, triangular solves and the matrix exponential. LU follows LAPACK's pivot rule
(the largest |re| + |im| in the column), so pivots and factors equal CPU's; results are
also checked by reconstruction (A = P L U, A = L L^H, A X = B)."""
import pytest
import torch

from util import assert_same, check_op, make

CDT = [torch.complex64, torch.complex128]
TOL = {torch.complex64: dict(atol=1e-4, rtol=1e-4),
       torch.complex128: dict(atol=1e-10, rtol=1e-10)}


@pytest.fixture(autouse=True)
def _precision(highest_precision):
    """Reconstructions and gradient formulas run matmuls on tpu; compare at "highest"."""
    yield


def cmake(shape, dtype, seed=0, noncontig=False):
    part = torch.float32 if dtype == torch.complex64 else torch.float64
    t = torch.complex(make(shape, part, seed=seed), make(shape, part, seed=seed + 100))
    return t.mT.contiguous().mT if noncontig else t


def well_conditioned(shape, dtype, seed=0, noncontig=False):
    n = shape[-1]
    a = cmake(shape, torch.complex128, seed) + 4 * n * torch.eye(n, dtype=torch.complex128)
    a = a.to(dtype)
    return a.mT.contiguous().mT if noncontig else a


def hpd(shape, dtype, seed=0):
    """Hermitian positive-definite matrices"""
    a = cmake(shape, torch.complex128, seed)
    return (a @ a.mH + shape[-1] * torch.eye(shape[-1], dtype=torch.complex128)).to(dtype)


# ---------------------------------------------------------------------- LU


@pytest.mark.parametrize("dtype", CDT)
@pytest.mark.parametrize("shape", [(4, 4), (3, 5, 5), (3, 5), (5, 3), (0, 3, 3)])
@pytest.mark.parametrize("noncontig", [False, True])
def test_lu_factor_and_lu(dtype, shape, noncontig):
    a = cmake(shape, dtype, seed=1, noncontig=noncontig)
    check_op(lambda x: torch.linalg.lu_factor_ex(x), a, **TOL[dtype])
    check_op(lambda x: torch.linalg.lu(x), a, **TOL[dtype])
    p, l, u = torch.linalg.lu(a.to("tpu"))
    torch.testing.assert_close((p @ l @ u).cpu(), a, **TOL[dtype])


@pytest.mark.parametrize("dtype", CDT)
def test_lu_pivot_rule_is_cabs1(dtype):
    """LAPACK's izamax: 2.9+2.9i (|re|+|im| = 5.8, modulus 4.10) beats 4.2 (4.2) as the
    pivot, though its modulus is smaller."""
    a = torch.tensor([[2.9 + 2.9j, 1.0], [4.2, 3.0 - 1.0j]], dtype=dtype)
    lu, piv = torch.linalg.lu_factor(a.to("tpu"))
    assert piv.cpu().tolist() == [1, 2]
    check_op(lambda x: torch.linalg.lu_factor_ex(x), a, **TOL[dtype])


@pytest.mark.parametrize("dtype", CDT)
def test_lu_singular_info_and_errors(dtype):
    a = torch.tensor([[[1.0, 2.0j], [2.0, 4.0j]], [[1.0j, 0.0], [0.0, 1.0]]], dtype=dtype)
    _, _, info = torch.linalg.lu_factor_ex(a.to("tpu"))
    assert info.cpu().tolist() == [2, 0]
    _, info = torch.linalg.inv_ex(a.to("tpu"))
    assert info.cpu().tolist() == [2, 0]
    with pytest.raises(torch.linalg.LinAlgError, match=r"diagonal element 2 is zero"):
        torch.linalg.inv(a.to("tpu"))
        torch.tpu.synchronize()
    b = cmake((2, 2, 1), dtype, seed=2)
    check_op(torch.linalg.lu_factor, a)  # both raise
    check_op(torch.linalg.solve, a, b)
    check_op(torch.linalg.det, a, **TOL[dtype])
    check_op(torch.linalg.slogdet, a, **TOL[dtype])


@pytest.mark.parametrize("dtype", CDT)
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("adjoint", [True, False])
def test_lu_solve_and_unpack(dtype, left, adjoint):
    a = well_conditioned((2, 4, 4), dtype)
    lu, piv = torch.linalg.lu_factor(a)
    b = cmake((2, 4, 3) if left else (2, 3, 4), dtype, seed=2)
    check_op(lambda l, p, y: torch.linalg.lu_solve(l, p, y, left=left, adjoint=adjoint),
             lu, piv, b, **TOL[dtype])
    x = torch.linalg.lu_solve(lu.to("tpu"), piv.to("tpu"), b.to("tpu"), left=left,
                              adjoint=adjoint).cpu()
    op_a = a.mH if adjoint else a
    torch.testing.assert_close(op_a @ x if left else x @ op_a, b, **TOL[dtype])
    check_op(lambda l, p: torch.lu_unpack(l, p), lu, piv, **TOL[dtype])


@pytest.mark.parametrize("dtype", CDT)
@pytest.mark.parametrize("bshape", [(5, 5), (5,), (5, 2), (3, 5, 2)])
@pytest.mark.parametrize("noncontig", [False, True])
def test_solve(dtype, bshape, noncontig):
    a = well_conditioned((5, 5), dtype, noncontig=noncontig)
    b = cmake(bshape, dtype, seed=3)
    check_op(torch.linalg.solve, a, b, **TOL[dtype])
    check_op(lambda x, y: torch.linalg.solve_ex(x, y), a, b, **TOL[dtype])
    check_op(lambda x, y: torch.linalg.solve(x, y, left=False), a, b.mT if b.dim() > 1 else b,
             **TOL[dtype])


@pytest.mark.parametrize("dtype", CDT)
@pytest.mark.parametrize("noncontig", [False, True])
def test_inv_det_slogdet(dtype, noncontig):
    a = well_conditioned((3, 4, 4), dtype, noncontig=noncontig)
    check_op(torch.linalg.inv, a, **TOL[dtype])
    check_op(lambda x: torch.linalg.inv_ex(x), a, **TOL[dtype])
    check_op(torch.linalg.det, a, **TOL[dtype])
    check_op(torch.linalg.slogdet, a, **TOL[dtype])
    check_op(torch.logdet, a, **TOL[dtype])
    # CPU factors a complex A itself (a real contiguous one as A^T): equal LU outputs
    check_op(lambda x: torch.ops.aten._linalg_det(x), a, **TOL[dtype])
    check_op(lambda x: torch.ops.aten._linalg_slogdet(x), a, **TOL[dtype])
    inv = torch.linalg.inv(a.to("tpu")).cpu()
    torch.testing.assert_close(a @ inv, torch.eye(4, dtype=dtype).expand(3, 4, 4), **TOL[dtype])


def test_slogdet_complex_sign():
    """sign = det / |det| is a unit complex number; the permutation flips it"""
    a = torch.tensor([[0.0, 2.0j], [1.0 + 1.0j, 3.0]], dtype=torch.complex128)
    sign, logabs = torch.linalg.slogdet(a.to("tpu"))
    det = torch.linalg.det(a)
    torch.testing.assert_close(sign.cpu(), det / det.abs())
    torch.testing.assert_close(logabs.cpu(), det.abs().log())
    assert logabs.dtype == torch.float64


@pytest.mark.parametrize("dtype", CDT)
def test_tensorinv_tensorsolve(dtype):
    a = well_conditioned((6, 6), dtype).reshape(6, 2, 3)
    check_op(lambda x: torch.linalg.tensorinv(x, ind=1), a, **TOL[dtype])
    b = cmake((6,), dtype, seed=4)
    check_op(torch.linalg.tensorsolve, a, b, **TOL[dtype])


# ----------------------------------------------------------------- Cholesky


@pytest.mark.parametrize("dtype", CDT)
@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_family(dtype, upper):
    a = hpd((2, 4, 4), dtype)
    check_op(lambda x: torch.linalg.cholesky(x, upper=upper), a, **TOL[dtype])
    check_op(lambda x: torch.linalg.cholesky_ex(x, upper=upper), a, **TOL[dtype])
    check_op(lambda x: torch.cholesky(x, upper=upper), a, **TOL[dtype])
    fac = torch.linalg.cholesky(a.to("tpu"), upper=upper).cpu()
    torch.testing.assert_close(fac.mH @ fac if upper else fac @ fac.mH, a, **TOL[dtype])
    check_op(lambda f: torch.cholesky_inverse(f, upper=upper), fac, **TOL[dtype])
    b = cmake((2, 4, 3), dtype, seed=5)
    check_op(lambda y, f: torch.cholesky_solve(y, f, upper=upper), b, fac, **TOL[dtype])
    x = torch.cholesky_solve(b.to("tpu"), fac.to("tpu"), upper=upper).cpu()
    torch.testing.assert_close(a @ x, b, **TOL[dtype])


@pytest.mark.parametrize("dtype", CDT)
@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_reads_one_triangle(dtype, upper):
    """only the named triangle is read, and the diagonal's imaginary parts are ignored,
    as by LAPACK's potrf"""
    a = hpd((3, 3), dtype, seed=6)
    junk = cmake((3, 3), dtype, seed=7)
    a = a.triu() + junk.tril(-1) if upper else a.tril() + junk.triu(1)
    a.diagonal().imag.fill_(5.0)
    check_op(lambda x: torch.linalg.cholesky(x, upper=upper), a, **TOL[dtype])


@pytest.mark.parametrize("dtype", CDT)
def test_cholesky_not_pd(dtype):
    a = torch.tensor([[[1.0, 2.0j], [-2.0j, 1.0]], [[2.0, 1j], [-1j, 1.0]]], dtype=dtype)
    l, info = torch.linalg.cholesky_ex(a.to("tpu"))
    assert info.cpu().tolist() == [2, 0]
    check_op(lambda x: torch.linalg.cholesky_ex(x), a, **TOL[dtype])  # the failed pivot too
    with pytest.raises(torch.linalg.LinAlgError, match=r"minor of order 2 is not positive"):
        torch.linalg.cholesky(a.to("tpu"))
        torch.tpu.synchronize()
    check_op(torch.linalg.cholesky, a)  # both raise


# -------------------------------------------------------- triangular solves


@pytest.mark.parametrize("dtype", CDT)
@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("unit", [False, True])
def test_solve_triangular(dtype, upper, left, unit):
    a = well_conditioned((2, 4, 4), dtype)
    b = cmake((2, 4, 3) if left else (2, 3, 4), dtype, seed=6)
    check_op(lambda x, y: torch.linalg.solve_triangular(x, y, upper=upper, left=left,
                                                        unitriangular=unit),
             a, b, **TOL[dtype])
    x = torch.linalg.solve_triangular(a.to("tpu"), b.to("tpu"), upper=upper, left=left,
                                      unitriangular=unit).cpu()
    t = a.triu() if upper else a.tril()
    if unit:
        t = t - torch.diag_embed(t.diagonal(dim1=-2, dim2=-1)) + torch.eye(4, dtype=dtype)
    torch.testing.assert_close(t @ x if left else x @ t, b, **TOL[dtype])


@pytest.mark.parametrize("dtype", CDT)
@pytest.mark.parametrize("upper", [True, False])
@pytest.mark.parametrize("transpose", [True, False])
def test_triangular_solve(dtype, upper, transpose):
    """torch.triangular_solve: transpose is A^T, not A^H, as on CPU"""
    a = well_conditioned((1, 4, 4), dtype)
    b = cmake((3, 4, 2), dtype, seed=6)
    for unit in (False, True):
        check_op(lambda x, y: torch.triangular_solve(y, x, upper=upper, transpose=transpose,
                                                     unitriangular=unit),
                 a, b, **TOL[dtype])


# ------------------------------------------------------- matrix exponential


@pytest.mark.parametrize("dtype", CDT)
@pytest.mark.parametrize("shape,scale", [((3, 3), 0.1), ((2, 4, 4), 1.0), ((5, 5), 4.0)])
def test_matrix_exp(dtype, shape, scale):
    a = cmake(shape, dtype, seed=8) * scale
    ref = torch.linalg.matrix_exp(a.to(torch.complex128)).to(dtype)
    out = torch.linalg.matrix_exp(a.to("tpu"))
    tol = dict(atol=1e-4, rtol=2e-5) if dtype == torch.complex64 else TOL[dtype]
    assert_same(out, ref, **tol)


def test_matrix_exp_of_hermitian_commuting():
    """exp(i t H) of a Hermitian H is unitary"""
    h = hpd((4, 4), torch.complex128, seed=9)
    u = torch.linalg.matrix_exp(1j * h.to("tpu")).cpu()
    torch.testing.assert_close(u @ u.mH, torch.eye(4, dtype=torch.complex128))


# ------------------------------------------------------------- gradients


@pytest.mark.parametrize("fn", [torch.linalg.inv, torch.linalg.det,
                                lambda x: torch.linalg.slogdet(x).logabsdet,
                                lambda x: torch.linalg.solve(x, x[..., 0].conj())],
                         ids=["inv", "det", "logabsdet", "solve"])
def test_gradients(fn):
    """PyTorch's complex backward formulas over the tpu kernels"""
    a = well_conditioned((2, 3, 3), torch.complex128, seed=10)
    check_op(fn, a, grad=True, **TOL[torch.complex128])
