"""Build driver: setuptools runs the Makefile, which builds the C runtime and
the bridge (torch_tpu/_C.so), and packages the result as a platform wheel.

`pip install --no-build-isolation .`, `python -m build --wheel --no-isolation`
and the editable install of scripts/setup.sh all go through build_py below.
make is incremental, so an editable install after `make bridge` only checks
that everything is up to date. The interpreter running the build (the one with
torch==2.13.0) is the one make builds against (PYTHON=sys.executable); that is
why builds keep --no-build-isolation (an isolated build would fetch a torch of
its own). TORCH_TPU_BUILD_JOBS sets make's -j (default: the CPU count).
"""
import os
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = os.path.dirname(os.path.abspath(__file__))


class build_py_with_make(build_py):
    def run(self):
        jobs = os.environ.get("TORCH_TPU_BUILD_JOBS") or str(os.cpu_count() or 1)
        subprocess.check_call(["make", "-s", "-j" + jobs, "PYTHON=" + sys.executable, "bridge"],
                              cwd=ROOT)
        super().run()


class BinaryDistribution(Distribution):
    """_C.so is built outside setuptools' ext_modules: say the wheel is
    platform-specific all the same."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": build_py_with_make}, distclass=BinaryDistribution)
