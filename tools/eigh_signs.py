"""How often PyTorch CPU's eigh eigenvectors (MKL's syevd) have the same signs as netlib
LAPACK's drivers (scipy.linalg.eigh, built on OpenBLAS's reference LAPACK), per size.

    .venv/bin/python tools/eigh_signs.py [--count 50]

Eigenvectors are defined up to sign; which sign a library returns is its own choice. The
figures show that "the signs LAPACK returns" is not one thing: MKL and reference LAPACK
agree on large matrices (divide and conquer, n > 25) but disagree on most small ones from
4 x 4 up, where MKL takes a path of its own. The op coverage sweep therefore compares eigh/eig
vectors as PyTorch's test_compare_cpu does (through the OpInfo's output_process_fn_grad).
"""
import argparse

import numpy as np
import scipy.linalg as sl
import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=50)
    a = ap.parse_args()
    torch.manual_seed(0)
    drivers = ["evd", "ev", "evr", "evx"]
    print(f"{'n':>3s} " + " ".join(f"{d:>8s}" for d in drivers) + "   (matrices whose every "
          f"eigenvector sign agrees with MKL's, of {a.count}; float64, UPLO=L)")
    for n in (2, 3, 4, 5, 8, 12, 32):
        agree = dict.fromkeys(drivers, 0)
        for _ in range(a.count):
            m = torch.randn(n, n, dtype=torch.float64)
            m = m + m.T
            v = torch.linalg.eigh(m)[1].numpy()
            for d in drivers:
                ref = sl.eigh(m.numpy(), driver=d, lower=True)[1]
                agree[d] += bool((np.sign((v * ref).sum(0)) > 0).all())
        print(f"{n:3d} " + " ".join(f"{agree[d]:8d}" for d in drivers))


if __name__ == "__main__":
    main()
