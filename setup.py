"""Build fastattn's compiled core: Cython + a small C micro-kernel file, with OpenMP.

Environment switches (printed in the build log):
  FASTATTN_NO_OPENMP=1       build without OpenMP (serial kernels)
  FASTATTN_FAIL_NO_OPENMP=1  fail instead of warning when OpenMP does not work (CI, wheels)
  FASTATTN_DEBUG=1           -O0 -g, Cython bounds checks on (ci/sanitize.sh: with -O1), and
                             the test-only kernel set avx2-wide (simd.h's FA_HAVE_AVX2_WIDE)
  FASTATTN_DEBUG_OPT=-O1     the optimisation level of a FASTATTN_DEBUG build (default -O0)
  FASTATTN_SANITIZE=...      extra flags for compile and link, e.g. "-fsanitize=address,undefined"
No -march=native and no -ffast-math, ever: the wheel runs on any x86-64 (the AVX2 / AVX-512
micro-kernels are selected at run time), and the masks rely on IEEE inf/NaN.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


def _env_flag(name):
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def _version():
    text = open(os.path.join(HERE, "fastattn", "_version.py")).read()
    return re.search(r'__version__ = "([^"]+)"', text).group(1)


OPENMP_PROBE = textwrap.dedent(
    """\
    #include <omp.h>
    #include <stdio.h>
    int main(void) {
    #pragma omp parallel num_threads(2)
        printf("nthreads=%d\\n", omp_get_num_threads());
        return 0;
    }
    """
)


def _openmp_flags(compiler):
    """(compile_flags, link_flags) for OpenMP with this compiler."""
    if compiler.compiler_type == "msvc":
        return ["/openmp"], []
    if sys.platform == "darwin":
        # Apple clang: libomp from Homebrew; ci/build_wheels.sh sets CPPFLAGS/LDFLAGS for it
        return ["-Xpreprocessor", "-fopenmp"], ["-lomp"]
    return ["-fopenmp"], ["-fopenmp"]


def _check_openmp(compiler, cflags, lflags):
    """Compile, link and run a probe: OpenMP works only if both threads print."""
    tmp = tempfile.mkdtemp()
    cwd = os.getcwd()
    try:
        os.chdir(tmp)
        with open("probe.c", "w") as f:
            f.write(OPENMP_PROBE)
        objs = compiler.compile(["probe.c"], extra_postargs=cflags)
        compiler.link_executable(objs, "probe", extra_postargs=lflags)
        out = subprocess.check_output([os.path.join(tmp, "probe")]).decode()
        lines = [x for x in out.splitlines() if x.startswith("nthreads=")]
        return len(lines) == 2 and all(x == "nthreads=2" for x in lines)
    except Exception as exc:  # noqa: BLE001 -- any failure means "no OpenMP"
        print(f"fastattn: OpenMP probe failed: {exc!r}")
        return False
    finally:
        os.chdir(cwd)
        shutil.rmtree(tmp, ignore_errors=True)


# sources compiled with -ffp-contract=off inside extensions that are not (BuildExt)
NO_CONTRACT_SOURCES = ("fa_portable.c", "fa_driver.c", "_attention.c", "_gemm.c")


class BuildExt(build_ext):
    def build_extensions(self):
        compiler = self.compiler
        msvc = compiler.compiler_type == "msvc"
        debug = _env_flag("FASTATTN_DEBUG")
        if msvc:
            base = ["/O2"]
        elif debug:
            opt = os.environ.get("FASTATTN_DEBUG_OPT", "-O0")
            if opt not in ("-O0", "-O1", "-Og"):
                raise ValueError(f"FASTATTN_DEBUG_OPT must be -O0, -O1 or -Og, got {opt!r}")
            base = [opt, "-g", "-fno-omit-frame-pointer"]
        else:
            base = ["-O3", "-g0"]
        if not msvc:
            base += ["-fno-math-errno", "-Wno-unused-function", "-Wno-unreachable-code", "-Wno-psabi",
                     "-Wno-unused-const-variable"]
        sanitize = os.environ.get("FASTATTN_SANITIZE", "").split()

        use_omp = not _env_flag("FASTATTN_NO_OPENMP")
        omp_c, omp_l = _openmp_flags(compiler)
        if use_omp and not _check_openmp(compiler, omp_c, omp_l):
            msg = (
                "fastattn: this compiler cannot build OpenMP code, so the kernels will run on one "
                "thread. Install an OpenMP runtime (libgomp with gcc; `brew install libomp` on "
                "macOS) or set FASTATTN_NO_OPENMP=1 to silence this."
            )
            if _env_flag("FASTATTN_FAIL_NO_OPENMP"):
                raise RuntimeError(msg + " (FASTATTN_FAIL_NO_OPENMP is set)")
            print("\n" + "*" * 80 + "\n" + msg + "\n" + "*" * 80 + "\n")
            use_omp = False
        if not use_omp:
            omp_c, omp_l = [], []
        cflags = base + omp_c + sanitize
        lflags = omp_l + sanitize
        print(f"fastattn: OpenMP {'on' if use_omp else 'off'}; compile flags {cflags}; link flags {lflags}")
        build_info = {
            "compiler": " ".join(getattr(compiler, "compiler_so", None) or [compiler.compiler_type]),
            "compile_flags": cflags,
            "link_flags": lflags,
            "openmp": use_omp,
            "debug": debug,
        }
        with open(os.path.join(HERE, "fastattn", "_build_info.py"), "w") as f:
            f.write("# Written by setup.py at build time.\nBUILD_INFO = %r\n" % (build_info,))
        for ext in self.extensions:
            ext.extra_compile_args = list(cflags)
            if not msvc and ext.name.endswith(("._search", "._qgemm", "._embedding")):
                # the search kernels, the int8 / bfloat16 GEMMs and the embedding's sums promise
                # the same bits from every ISA build and architecture: nothing fused (AVX-512F
                # and FMA targets, and AArch64 by default, would otherwise contract a * b + c)
                ext.extra_compile_args.append("-ffp-contract=off")
            ext.extra_link_args = lflags
        if not msvc:
            # single files of an extension built the same way: the portable attention, the
            # attention driver around it and the Cython modules' own loops (RMSNorm's rows):
            # baseline code, so nothing changes on x86-64, whose baseline has no FMA; AArch64
            # would contract
            compile_one = compiler._compile

            def _compile(obj, src, ext, cc_args, extra_postargs, pp_opts):
                if os.path.basename(src) in NO_CONTRACT_SOURCES:
                    extra_postargs = list(extra_postargs) + ["-ffp-contract=off"]
                return compile_one(obj, src, ext, cc_args, extra_postargs, pp_opts)

            compiler._compile = _compile
        super().build_extensions()

    def run(self):
        super().run()
        # editable/in-place builds read _build_info.py from the source tree; copy it for wheels
        src = os.path.join(HERE, "fastattn", "_build_info.py")
        dst = os.path.join(self.build_lib, "fastattn", "_build_info.py")
        if os.path.exists(src) and os.path.isdir(os.path.dirname(dst)):
            shutil.copyfile(src, dst)


def _extensions():
    debug = _env_flag("FASTATTN_DEBUG")
    common = dict(
        include_dirs=[numpy.get_include(), "fastattn/_kernels"],
        # FASTATTN_DEBUG: the kernels check that every workspace piece they touch is their own
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")]
        + ([("FASTATTN_DEBUG", "1")] if debug else []),
    )
    K = "fastattn/_kernels/"
    # every kernel module reads the one ISA state of _simd and launches teams with fa_team.h
    shared = [K + "simd.h", K + "fa_team.h", K + "_simd.pxd", K + "_openmp.pxd"]

    def kernels(name, sources, depends=()):
        return Extension("fastattn._kernels." + name, sources=[K + name + ".pyx"]
                         + [K + f for f in sources], depends=shared + [K + f for f in depends],
                         **common)

    exts = [
        # the ISA state (dispatch.c is compiled here only) and its Python functions
        kernels("_simd", ["dispatch.c"]),
        # the fused attention
        kernels("_attention", ["fa_kernels.c", "fa_driver.c", "fa_portable.c"],
                ["fa_tile.h", "fa_kernels.h", "fa_workspace.h", "fa_driver.h",
                 "fa_driver_impl.h"]),
        # the linear layers: packed-weight GEMM with fused epilogues, activations, LayerNorm
        kernels("_gemm", ["gemm_kernels.c"], ["gemm_tile.h", "gemm_kernels.h", "_gemm.pxd"]),
        # the int8 linear layers: row quantisation, integer micro-kernels, the float epilogue
        # and the bfloat16 ones (their epilogue and LayerNorm are the int8 layers')
        kernels("_qgemm", ["qgemm_kernels.c", "bgemm_kernels.c"],
                ["gemm_tile.h", "gemm_kernels.h", "qgemm_tile.h", "qgemm_kernels.h",
                 "bgemm_kernels.h"]),
        # the encoders' embedding layer: gather, sums and the GEMM module's LayerNorm rows
        kernels("_embedding", [], ["gemm_kernels.h", "_gemm.pxd"]),
        # beam search's row kernels: log-softmax of the logits, top-k over a source's beams
        kernels("_search", ["search_kernels.c"], ["search_kernels.h"]),
        # the decoder's KV cache: beam search's reorder of its rows
        kernels("_kv_cache", []),
    ]
    return cythonize(
        exts,
        compiler_directives={
            "language_level": 3,
            "boundscheck": debug,
            "wraparound": False,
            "initializedcheck": debug,
            "nonecheck": False,
            "cdivision": True,
            "embedsignature": True,
        },
    )


setup(version=_version(), ext_modules=_extensions(), cmdclass={"build_ext": BuildExt})
