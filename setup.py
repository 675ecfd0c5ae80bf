"""Package layout: the top-level folders install as subpackages of `swama`.

The repository keeps the design's folders (engine/, handlers/, generated/, tools/, specs/) at the
top, but a wheel must not put generic names such as `engine` or `tools` into site-packages. Every
package below each folder is found by walking it, so a new subpackage can never be left out.
"""

from setuptools import find_packages, setup

FOLDERS = ("engine", "handlers", "generated", "tools", "specs")

package_dir = {f"swama.{folder}": folder for folder in FOLDERS}
packages = [
    name
    for folder in FOLDERS
    for name in (f"swama.{folder}", *(f"swama.{folder}.{sub}" for sub in find_packages(folder)))
]

setup(package_dir=package_dir, packages=packages)
