"""What the offline GPU bundles of tools/gpu.sh carry: their requirement lists and, for a runtime
bundle, which of the downloaded wheels it keeps.

    python3 -m tools.gpu_bundle requirements full|runtime   one requirement a line
    python3 -m tools.gpu_bundle keep WHEEL_DIR [PROVIDED]    the wheels there a runtime bundle keeps

A full bundle carries what the test suite needs: the project's dependencies with the cuda and test
extras. A runtime bundle carries what `swama serve` and the benchmarks need: the dependencies and the
cuda extra (the benchmarks import nothing more that the target lacks), less RUNTIME_LEAVES_OUT and
whatever only those packages require. tools/gpu.sh runs this with a bare python3, so it uses the
standard library and pip's own copy of `packaging`.
"""

from __future__ import annotations

import re
import sys
import tomllib
import zipfile
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path

try:
    from packaging.requirements import Requirement
except ImportError:  # a python3 with pip but without packaging
    from pip._vendor.packaging.requirements import Requirement

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"

# lm-eval needs sqlitedict, published as source only, which a wheels-only bundle cannot carry: the
# lm-evaluation-harness tests skip there.
NOT_BUNDLED = ("lm-eval",)

# Nothing on the way to serving language, vision, embedding or speech-to-text models and decisions,
# nor the benchmarks, imports these; the features that do (below) fail with an error naming them.
RUNTIME_LEAVES_OUT = {
    "phonemizer-fork": "KittenTTS text to speech (with espeak-ng, which a runtime bundle lacks too)",
    "matplotlib": "the reliability diagram of `swama calibrate` (--no-plot skips it)",
    "datasets": "mlx-vlm's training and evaluation scripts",
    "cryptography": "mlx-vlm's own server",
}

# The target's python (3.12 on Linux x86-64), for the markers of the wheels' requirements.
TARGET = {"python_version": "3.12", "python_full_version": "3.12.0", "implementation_version": "3.12.0",
          "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
          "os_name": "posix", "implementation_name": "cpython", "platform_python_implementation": "CPython"}


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(kind: str) -> list[str]:
    """The requirements a bundle of `kind` ("full" or "runtime") downloads, in pyproject's order."""
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    roots = project["dependencies"] + extras["cuda"]
    if kind == "full":
        roots += extras["test"]
    elif kind != "runtime":
        raise ValueError(f"a bundle is full or runtime, not {kind!r}")
    out: list[str] = []
    seen: set[str] = set()

    def walk(reqs: list[str]) -> None:  # an extra may name others of this project ("swama[dev]")
        for req in reqs:
            if req.startswith("swama["):
                for name in req[len("swama["):].rstrip("]").split(","):
                    if name not in seen:
                        seen.add(name)
                        walk(extras[name.strip()])
            elif req not in seen and not req.startswith(NOT_BUNDLED):
                seen.add(req)
                if kind == "full" or normalized(Requirement(req).name) not in RUNTIME_LEAVES_OUT:
                    out.append(req)

    walk(roots)
    return out


def _applies(req: Requirement, extras: Iterable[str]) -> bool:
    return req.marker is None or any(req.marker.evaluate({**TARGET, "extra": e}) for e in extras)


def reach(requires: Mapping[str, list[str]], roots: Iterable[str], leave_out: Collection[str]) -> set[str]:
    """The (normalized) names `roots` require on the target, directly or through others, by each
    package's Requires-Dist lines in `requires`; a name in `leave_out` is neither kept nor followed."""
    expanded: dict[str, set[str]] = {}  # name: the extras whose requirements were followed
    todo = [req for req in map(Requirement, roots) if _applies(req, [""])]
    while todo:
        req = todo.pop()
        name = normalized(req.name)
        new = {"", *req.extras} - expanded.get(name, set())
        if name in leave_out or not new:
            continue
        if name not in requires:
            raise SystemExit(f"{name} is required ({req}) but no wheel of it was downloaded")
        expanded.setdefault(name, set()).update(new)
        todo += [dep for dep in map(Requirement, requires[name]) if _applies(dep, new)]
    return set(expanded)


def wheel_requires(path: Path) -> tuple[str, list[str]]:
    """A wheel's project name (normalized) and its Requires-Dist lines."""
    with zipfile.ZipFile(path) as wheel:
        meta = next(n for n in wheel.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        text = wheel.read(meta).decode("utf-8")
    headers = text.split("\n\n", 1)[0].splitlines()
    name = next(line.split(":", 1)[1].strip() for line in headers if line.startswith("Name:"))
    return normalized(name), [line.split(":", 1)[1].strip() for line in headers if line.startswith("Requires-Dist:")]


def runtime_wheels(wheel_dir: Path) -> tuple[list[Path], list[Path]]:
    """The wheels in `wheel_dir` a runtime bundle keeps, and those it leaves out."""
    names = {path: wheel_requires(path) for path in sorted(wheel_dir.glob("*.whl"))}
    reached = reach(dict(names.values()), requirements("runtime"), RUNTIME_LEAVES_OUT)
    kept = [path for path, (name, _) in names.items() if name in reached]
    return kept, [path for path in names if path not in kept]


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "requirements":
        print("\n".join(requirements(argv[1])))
    elif len(argv) in (2, 3) and argv[0] == "keep":
        kept, left = runtime_wheels(Path(argv[1]))
        print("\n".join(map(str, kept)))
        # What it saves: the wheels left out that the target does not provide (PROVIDED, a regex of names).
        provided = re.compile(argv[2] if len(argv) == 3 else "$^")
        saved = [p for p in left if not provided.match(wheel_requires(p)[0])]
        print(f"runtime bundle: leaves out {', '.join(wheel_requires(p)[0] for p in saved)} "
              f"({sum(p.stat().st_size for p in saved) / 2**20:.1f} MiB)", file=sys.stderr)
    else:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
