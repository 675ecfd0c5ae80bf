"""Package layout: the top-level folders install as subpackages of `swama`.

The repository keeps the design's folders (engine/, handlers/, generated/, specs/) at the top, but a
wheel must not put generic names such as `engine` into site-packages. Every package below each
folder is found by walking it, so a new subpackage can never be left out.

tools/ is not in the wheel: the spec pipeline, the benchmarks and the test-model builders are
development tools that run from a checkout (`python -m tools.spec check`, `python -m tools.bench.blas`).
The server needs none of them, and they need what the server does not (datamodel-code-generator,
mlx_lm.server, PyTorch).
"""

from setuptools import find_packages, setup

FOLDERS = ("engine", "handlers", "generated", "specs")

package_dir = {f"swama.{folder}": folder for folder in FOLDERS}
packages = [
    name
    for folder in FOLDERS
    for name in (f"swama.{folder}", *(f"swama.{folder}.{sub}" for sub in find_packages(folder)))
]

setup(package_dir=package_dir, packages=packages)
