"""At install, stores in the package what it reads from this checkout
otherwise: the public headers' declarations (peclient/_cdef.py, made by
peclient/_headers.py) and where the build tree is (peclient/_source.py:
<source>/build, where peclient/_ffi.py looks for libpeclient.so.0 after
$PE_BUILD_DIR)."""
import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parent


def _headers_module():
    spec = importlib.util.spec_from_file_location("_headers", HERE / "peclient" / "_headers.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class BuildPyWithSource(build_py):
    def run(self):
        super().run()
        pkg = Path(self.build_lib) / "peclient"
        cdef = _headers_module().cdef(SOURCE / "client" / "include")
        (pkg / "_cdef.py").write_text("CDEF = %r\n" % cdef)
        (pkg / "_source.py").write_text("BUILD_DIR = %r\n" % str(SOURCE / "build"))


setup(cmdclass={"build_py": BuildPyWithSource})
