"""Dense linear algebra on tpu against PyTorch's CPU results: LU (factor,
solve, inverse, det, slogdet, unpack), Cholesky, triangular solves, QR,
Householder products, SVD and symmetric eigendecomposition. Values are
compared where they are unique; SVD and eigenvector signs are not (Jacobi vs
LAPACK), so those compare reconstructions, orthogonality and |vectors|."""
import pytest
import torch

from util import assert_same, check_op, make

DTYPES = [torch.float32, torch.float64]
TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.float64: dict(atol=1e-10, rtol=1e-10)}


@pytest.fixture(autouse=True)
def highest_precision():
    """Gradient formulas run matmuls on tpu; compare at "highest"."""
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(old)


def well_conditioned(shape, dtype, seed=0, noncontig=False):
    n = shape[-1]
    a = make(shape, torch.float64, seed=seed) + 4 * n * torch.eye(n, dtype=torch.float64)
    a = a.to(dtype)
    return a.mT.contiguous().mT if noncontig else a


def spd(shape, dtype, seed=0):
    a = make(shape, torch.float64, seed=seed)
    return (a @ a.mT + shape[-1] * torch.eye(shape[-1], dtype=torch.float64)).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4, 4), (3, 5, 5), (3, 5), (5, 3), (0, 3, 3)])
@pytest.mark.parametrize("noncontig", [False, True])
def test_lu_factor_and_lu(dtype, shape, noncontig):
    a = make(shape, dtype, seed=1, noncontig=noncontig)
    check_op(lambda x: torch.linalg.lu_factor_ex(x), a, **TOL[dtype])
    check_op(lambda x: torch.linalg.lu(x), a, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_lu_factor_singular_info(dtype):
    a = torch.tensor([[[1.0, 2.0], [2.0, 4.0]], [[1.0, 0.0], [0.0, 1.0]]], dtype=dtype)
    lu, piv, info = torch.linalg.lu_factor_ex(a.to("tpu"))
    assert info.cpu().tolist() == [2, 0]
    with pytest.raises(RuntimeError):
        torch.linalg.lu_factor(a.to("tpu"))
        torch.tpu.synchronize()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("adjoint", [True, False])
def test_lu_solve(dtype, left, adjoint):
    a = well_conditioned((2, 4, 4), dtype)
    lu, piv = torch.linalg.lu_factor(a)
    b = make((2, 4, 3) if left else (2, 3, 4), dtype, seed=2)
    check_op(lambda l, p, y: torch.linalg.lu_solve(l, p, y, left=left, adjoint=adjoint),
             lu, piv, b, grad=True, **TOL[dtype])
    # unpacking the same factorization
    check_op(lambda l, p: torch.lu_unpack(l, p), lu, piv, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bshape", [(5, 5), (5,), (5, 2), (3, 5, 2)])
@pytest.mark.parametrize("noncontig", [False, True])
def test_solve(dtype, bshape, noncontig):
    a = well_conditioned((5, 5), dtype, noncontig=noncontig)
    b = make(bshape, dtype, seed=3)
    check_op(torch.linalg.solve, a, b, grad=True, **TOL[dtype])
    check_op(lambda x, y: torch.linalg.solve_ex(x, y), a, b, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_solve_left_false(dtype):
    a = well_conditioned((2, 4, 4), dtype)
    b = make((2, 3, 4), dtype, seed=4)
    check_op(lambda x, y: torch.linalg.solve(x, y, left=False), a, b, grad=True, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("noncontig", [False, True])
def test_inv_det_slogdet(dtype, noncontig):
    a = well_conditioned((3, 4, 4), dtype, noncontig=noncontig)
    check_op(torch.linalg.inv, a, grad=True, **TOL[dtype])
    check_op(lambda x: torch.linalg.inv_ex(x), a, **TOL[dtype])
    check_op(torch.linalg.det, a, grad=True, **TOL[dtype])
    check_op(torch.linalg.slogdet, a, grad=True, **TOL[dtype])
    check_op(lambda x: torch.ops.aten._linalg_det(x), a, **TOL[dtype])


def test_det_singular_and_negative():
    a = torch.tensor([[[1.0, 2.0], [2.0, 4.0]], [[0.0, 1.0], [1.0, 0.0]]])
    check_op(torch.linalg.det, a)
    check_op(torch.linalg.slogdet, a)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_family(dtype, upper):
    a = spd((2, 4, 4), dtype)
    check_op(lambda x: torch.linalg.cholesky(x, upper=upper), a, grad=True, **TOL[dtype])
    check_op(lambda x: torch.linalg.cholesky_ex(x, upper=upper), a, **TOL[dtype])
    fac = torch.linalg.cholesky(a, upper=upper)
    check_op(lambda f: torch.cholesky_inverse(f, upper=upper), fac, grad=True, **TOL[dtype])
    b = make((2, 4, 3), dtype, seed=5)
    check_op(lambda y, f: torch.cholesky_solve(y, f, upper=upper), b, fac, grad=True,
             **TOL[dtype])


def test_cholesky_not_pd():
    a = torch.tensor([[[1.0, 2.0], [2.0, 1.0]], [[2.0, 0.0], [0.0, 1.0]]])
    _, info = torch.linalg.cholesky_ex(a.to("tpu"))
    assert info.cpu().tolist() == [2, 0]
    check_op(torch.linalg.cholesky, a)  # both raise


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("unit", [False, True])
def test_solve_triangular(dtype, upper, left, unit):
    a = well_conditioned((2, 4, 4), dtype)
    b = make((2, 4, 3) if left else (2, 3, 4), dtype, seed=6)
    check_op(lambda x, y: torch.linalg.solve_triangular(x, y, upper=upper, left=left,
                                                        unitriangular=unit),
             a, b, grad=True, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("upper", [True, False])
@pytest.mark.parametrize("transpose", [True, False])
def test_triangular_solve(dtype, upper, transpose):
    """the legacy torch.triangular_solve: (solution, cloned coefficient), batch broadcast"""
    a = well_conditioned((1, 4, 4), dtype)
    b = make((3, 4, 2), dtype, seed=6)
    for unit in (False, True):
        check_op(lambda x, y: torch.triangular_solve(y, x, upper=upper, transpose=transpose,
                                                     unitriangular=unit),
                 a, b, grad=True, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4, 4), (2, 5, 3), (2, 3, 5)])
@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
def test_qr(dtype, shape, mode):
    a = make(shape, dtype, seed=7)
    differentiable = mode == "reduced" or (mode == "complete" and shape[-2] <= shape[-1])
    check_op(lambda x: torch.linalg.qr(x, mode=mode), a, grad=differentiable, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("transpose", [False, True])
def test_householder_product_ormqr(dtype, transpose):
    a = make((2, 5, 3), dtype, seed=8)
    refl, tau = torch.geqrf(a)
    check_op(torch.linalg.householder_product, refl, tau, grad=True, **TOL[dtype])
    c = make((2, 5, 4), dtype, seed=9)
    check_op(lambda r, t, y: torch.ormqr(r, t, y, True, transpose), refl, tau, c, **TOL[dtype])
    check_op(lambda r, t, y: torch.ormqr(r, t, y.mT, False, transpose), refl, tau, c,
             **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4, 4), (2, 6, 3), (2, 3, 6), (3, 0)])
@pytest.mark.parametrize("full", [False, True])
def test_svd(dtype, shape, full):
    a = make(shape, dtype, seed=10)
    u, s, vh = torch.linalg.svd(a.to("tpu"), full_matrices=full)
    u0, s0, vh0 = torch.linalg.svd(a, full_matrices=full)
    assert (u.shape, s.shape, vh.shape) == (u0.shape, s0.shape, vh0.shape)
    torch.testing.assert_close(s.cpu(), s0, **TOL[dtype])
    k = s.shape[-1]
    rec = (u.cpu()[..., :k] * s.cpu().unsqueeze(-2)) @ vh.cpu()[..., :k, :]
    torch.testing.assert_close(rec, a, **TOL[dtype])
    eye = torch.eye(u.shape[-1], dtype=dtype).expand(*u.shape[:-2], -1, -1)
    torch.testing.assert_close(u.cpu().mT @ u.cpu(), eye, **TOL[dtype])
    eye = torch.eye(vh.shape[-2], dtype=dtype).expand(*vh.shape[:-2], -1, -1)
    torch.testing.assert_close(vh.cpu() @ vh.cpu().mT, eye, **TOL[dtype])
    check_op(torch.linalg.svdvals, a, grad=True, **TOL[dtype])


def test_svd_rank_deficient():
    a = torch.outer(torch.arange(1.0, 5.0, dtype=torch.float64), torch.ones(3, dtype=torch.float64))
    u, s, vh = torch.linalg.svd(a.to("tpu"), full_matrices=True)
    torch.testing.assert_close(s.cpu(), torch.linalg.svdvals(a))
    torch.testing.assert_close(u.cpu().mT @ u.cpu(), torch.eye(4, dtype=torch.float64))
    torch.testing.assert_close((u.cpu()[:, :3] * s.cpu()) @ vh.cpu(), a)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("uplo", ["L", "U"])
def test_eigh(dtype, uplo):
    a = make((2, 5, 5), dtype, seed=11)  # not symmetric: only one triangle is read
    w, v = torch.linalg.eigh(a.to("tpu"), UPLO=uplo)
    w0, v0 = torch.linalg.eigh(a, UPLO=uplo)
    torch.testing.assert_close(w.cpu(), w0, **TOL[dtype])
    torch.testing.assert_close(v.cpu().abs(), v0.abs(), **TOL[dtype])
    check_op(lambda x: torch.linalg.eigvalsh(x, UPLO=uplo), a, grad=True, **TOL[dtype])


def test_unsupported_dtype():
    a = torch.eye(3, dtype=torch.float16)
    with pytest.raises((NotImplementedError, RuntimeError)):
        torch.linalg.inv(a.to("tpu")).cpu()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64,
                                   torch.int32])
def test_cross(dtype):
    a, b = make((4, 3), dtype, seed=12), make((4, 3), dtype, seed=13)
    tol = dict(atol=5e-2, rtol=2e-2) if dtype == torch.bfloat16 else {}
    check_op(torch.linalg.cross, a, b, **tol)
    check_op(lambda x, y: torch.linalg.cross(x, y, dim=0), a.T, b.T, **tol)
    check_op(torch.linalg.cross, make((2, 1, 3), dtype, seed=14), make((5, 3), dtype, seed=15),
             **tol)  # broadcast
    check_op(lambda x, y: torch.cross(x, y, dim=1), make((2, 3, 4), dtype, seed=16),
             make((2, 3, 4), dtype, seed=17), **tol)
