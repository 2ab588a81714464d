"""cibuildwheel's configuration for a generated per-arch project.

``cibuildwheel_config(arch)`` is the ``[tool.cibuildwheel]`` text the generated
``pyproject.toml`` should carry; the wheels workflow also writes it to a file and
passes it with ``--config-file``, so it applies whether or not the project has it.
It builds one identifier, ``cp311-manylinux_x86_64``: the wheel holds Python,
cubins and one small host module (the loader's launch path, ``tkc/runtime/_launch*.c``)
built against CPython's stable ABI, so one interpreter stands for all of them
(the wheel is tagged ``cp310-abi3``).

Why the generated project has a build hook
------------------------------------------
Where tkc could compile the launch module its wheels are ``cp310-abi3-linux_x86_64``;
without it they are pure (``py3-none-any``). On Linux cibuildwheel checks
the name of the wheel the backend produced, *before* the repair step, and stops
with ``NonPlatformWheelError`` (exit code 5) when it ends in ``none-any.whl``
(``cibuildwheel/platforms/linux.py``); a ``repair-wheel-command`` that retags the
wheel comes too late. So the backend itself must write a platform tag, and tkc does it this way:

* The generated project is built with hatchling and a build hook of a few lines
  (``hatch_build.py`` next to the pyproject, enabled by an empty
  ``[tool.hatch.build.targets.wheel.hooks.custom]`` table) whose ``initialize``
  sets ``build_data["pure_python"] = False`` and ``build_data["tag"] =
  "cp310-abi3-<TKC_WHEEL_PLATFORM>"`` (``py3-none-<TKC_WHEEL_PLATFORM>`` for a package
  without the launch module) when that variable is set (only this config sets it). Tried on
  ``build/pkg/tile_kernels_aot/sm90``: the wheel is ``tile_kernels_aot-0.1.0+sm90-cp310-abi3-
  manylinux_2_17_x86_64.whl`` with ``Root-Is-Purelib: false``, the hook file is
  not in it, two builds with ``SOURCE_DATE_EPOCH`` set are byte-identical, and
  cibuildwheel's ``find_compatible_wheel`` takes it for ``cp311-manylinux_x86_64``
  (and ``cp312``; not for ``cp39``, below the stable-ABI floor).
  It needs ``hatchling`` as a tkc dependency (``tkc build`` builds without isolation).
* Config-only alternative: setuptools with ``[tool.distutils.bdist_wheel]
  plat-name = "manylinux_2_17_x86_64"`` gives the same tag and is reproducible,
  but setuptools calls ``[tool.distutils]`` experimental and leaves ``build/`` and
  ``*.egg-info`` in the project folder, which ``sync_tree`` then deletes, so each
  ``tkc build`` would rebuild the wheel.

The tag is honest about the OS (the loader opens ``libcuda.so.1``), the CPU (the
launch module is x86_64 code) and the policy: the module links against nothing
but the Python API, so it has no library to graft. GH200/GB200 hosts are aarch64;
serving them takes an ``aarch64`` wheel (``archs = ["aarch64"]`` on an arm
runner). auditwheel cannot repair these wheels: a cubin is an ELF file of
machine ``EM_CUDA``, which auditwheel ignores ("unknown architecture") and then
fails with "no ELF ... with a 'x86_64' architecture found" (checked here with
auditwheel on a retagged sm90 wheel), hence ``repair-wheel-command = ""``.
Independent of cibuildwheel, PyPI refuses local versions such as ``+sm90``:
publishing there needs the arch in the name or on a separate index.
"""

from __future__ import annotations

# The one build: CPython 3.11 in the manylinux_2_28 container cibuildwheel uses by default.
BUILD_IDENTIFIERS: tuple[str, ...] = ("cp311-manylinux_x86_64",)
# Same value as tkc.package.SOURCE_DATE_EPOCH (a test keeps them equal); not imported from there so
# that package.py can import this module without a cycle.
SOURCE_DATE_EPOCH = "315532800"
# Installed before the wheel in cibuildwheel's test venv: the wheel's torch dependency is then
# already met, and the CPU build is about 200 MB instead of several GB of CUDA libraries.
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"


def _test_command(arch_name: str) -> str:
    # The distribution name is the import name in generated projects; read it from the project
    # so that the config needs only the arch. Run by sh in a temporary folder, so the import finds
    # the installed wheel, not the source tree. No braces but {package}: cibuildwheel formats it.
    script = ("import sys, tomllib, importlib; "
              "name = tomllib.load(open(sys.argv[1], 'rb'))['project']['name']; "
              "pkg = importlib.import_module(name); "
              "assert pkg.ARCH == sys.argv[2], (name, pkg.ARCH, sys.argv[2]); "
              "print(name, pkg.__version__, 'imports without a GPU')")
    return f'python -c "{script}" {{package}}/pyproject.toml {arch_name}'


def cibuildwheel_config(arch_name: str) -> str:
    """The ``[tool.cibuildwheel]`` TOML of the generated project of ``arch_name`` (``"sm90"``)."""
    identifiers = ", ".join(f'"{i}"' for i in BUILD_IDENTIFIERS)
    return (
        "[tool.cibuildwheel]\n"
        "# Python, cubins and a stable-ABI (cp310-abi3) launch module: one CPython builds it for all.\n"
        f"build = [{identifiers}]\n"
        '# Explicit so that the build (and --print-build-identifiers) is the same on any host.\n'
        'archs = ["x86_64"]\n'
        '# No before-build: the backend is fetched from PyPI into an isolated build environment.\n'
        'build-frontend = "build"\n'
        "# The generated hatch_build.py tags the wheel for this platform, which cibuildwheel needs.\n"
        f'environment = {{ SOURCE_DATE_EPOCH = "{SOURCE_DATE_EPOCH}", '
        'TKC_WHEEL_PLATFORM = "manylinux_2_17_$(uname -m)" }\n'
        f'before-test = "pip install torch --index-url {CPU_TORCH_INDEX}"\n'
        "# Imports the installed wheel on a machine with no GPU and checks its arch.\n"
        f"test-command = '''{_test_command(arch_name)}'''\n"
        "\n"
        "[tool.cibuildwheel.linux]\n"
        "# auditwheel ignores the cubins (ELF of machine EM_CUDA) and finds no host ELF to audit.\n"
        'repair-wheel-command = ""\n'
    )
