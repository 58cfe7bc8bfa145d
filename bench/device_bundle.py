"""The device bundle: every wheel the GPU machine's image lacks, in one git-ignored folder that
travels with the working tree (64 MiB in all, the tree included), so that `bash bench/gpu.sh`
installs Ray and the project there with `pip install --no-index` and runs every step.

    bash bench/device_bundle.sh [--python-version 3.12] [--out .whl] [--arch x86_64]

What goes in (`bench/gpu_image.txt` lists what the image already has):
- Ray of the pinned version, slimmed: without its Java jar (`ray/jars`, 30.7 MiB; Java workers),
  RLlib and Ray LLM (imported by nothing here) and the dashboard's source maps, with the symbol
  tables of its binaries stripped (`strip --strip-unneeded`: the dynamic symbols stay, so it
  links and runs the same; only a C++ crash trace loses function names). Its RECORD is rewritten
  with the new files' sizes and hashes, so pip installs it as the same `ray==2.60.0`;
- every wheel but pip's recompressed with LZMA, a ZIP method pip reads: 25% smaller than deflate
  for Ray's binaries;
- every requirement of `ray[default,train]`, of the project and of its `deepspeed` extra that
  the image does not hold, resolved for the target's Python and platform. A wheel of a package
  the image does hold is carried anyway when it is small (under 2 MiB), so that pip can upgrade
  the image's copy where Ray asks for a newer one; the large ones (pyarrow, numpy, pandas,
  grpcio) are left to the image, whose copies Ray's loose bounds accept;
- DeepSpeed, built here into a wheel (PyPI has only its source, and the image no compiler setup);
- pip and the project's build backend (setuptools), so that an image without pip still installs.

It prints every wheel with its size, the bundle's total, the working tree's, and their sum
against the 64 MiB limit; it exits 1 over the limit. Needs the registry and, for DeepSpeed's
wheel, torch in the Python that runs it (`$PYTHON`, else `.venv/bin/python`, else python3).
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGE_FILE = os.path.join(REPO, "bench", "gpu_image.txt")
LIMIT_MIB = 64.0
# A wheel of a package the image holds is carried when smaller than this (pip may need to
# upgrade the image's copy), and left to the image when larger.
LARGE_MIB = 2.0
# The newest glibc a carried wheel may need: the GPU image's Python is 3.12.3 (Ubuntu 24.04,
# glibc 2.39) and this machine's Debian 12 has 2.36, so 2.35 suits both.
MAX_GLIBC = (2, 35)
# What nothing here imports, and so the slimmed Ray wheel leaves out (paths inside the wheel).
RAY_DROPPED = (
    re.compile(r"^ray/jars/"),                 # Java workers: 30.7 MiB
    re.compile(r"^ray/rllib/"),                # RLlib: imported only for an RLlib trainable's name
    re.compile(r"^ray/llm/"),                  # Ray LLM (vLLM serving)
    re.compile(r"^ray/dashboard/client/build/.*\.map$"),  # the dashboard's source maps
)
# Packages that must never be downloaded: the image's CUDA stack is gigabytes.
NEVER = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*)$")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_image(path: str = IMAGE_FILE) -> dict[str, dict]:
    """The image's packages: canonical name -> {"pin": "name==version" or "name", "cuda_only": bool}."""
    packages = {}
    with open(path) as f:
        for line in f:
            text, _, comment = line.partition("#")
            text = text.strip()
            if not text:
                continue
            name = re.split(r"[=<>!~ ]", text, maxsplit=1)[0]
            packages[canonical(name)] = {"pin": text, "cuda_only": "cuda-only" in comment}
    return packages


def read_project(root: str = REPO) -> dict:
    """The project's runtime requirements, its deepspeed extra and its build requirements."""
    import tomllib

    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)
    return {"dependencies": project["project"]["dependencies"],
            "deepspeed": project["project"]["optional-dependencies"]["deepspeed"],
            "build": project["build-system"]["requires"]}


def requirement_name(requirement: str) -> str:
    return canonical(re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1))


def platforms(arch: str) -> list[str]:
    """pip's --platform tags for a manylinux machine of `arch` with glibc up to MAX_GLIBC."""
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(5, MAX_GLIBC[1] + 1)]
    legacy = {"manylinux1": 5, "manylinux2010": 12, "manylinux2014": 17}
    tags += [f"{name}_{arch}" for name, minor in legacy.items() if arch == "x86_64" or minor >= 17]
    return tags


def pip(python: str, *args: str) -> None:
    command = [python, "-m", "pip", *args, "--disable-pip-version-check"]
    print("+ " + " ".join(command), flush=True)
    subprocess.run(command, check=True)


def build_deepspeed_wheel(python: str, requirement: str, into: str) -> str:
    """DeepSpeed's wheel, built here from its source (no ops compiled: it builds them at run time,
    and Lightning's DeepSpeedStrategy with a torch optimizer needs none). Its setup imports torch,
    so it builds without isolation in `python`'s own environment."""
    sources = tempfile.mkdtemp(prefix="device-bundle-ds-")
    try:
        pip(python, "download", "--quiet", "--no-deps", "--no-binary=:all:", "-d", sources, requirement)
        (sdist,) = os.listdir(sources)
        env = {**os.environ, "DS_BUILD_OPS": "0"}
        command = [python, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                   "--disable-pip-version-check", "-w", into, os.path.join(sources, sdist)]
        print("+ " + " ".join(command), flush=True)
        subprocess.run(command, check=True, env=env)
    finally:
        shutil.rmtree(sources, ignore_errors=True)
    (wheel,) = [name for name in os.listdir(into) if canonical(name.split("-")[0]) == "deepspeed"]
    return os.path.join(into, wheel)


def wheel_requirements(wheel: str, python_version: str) -> list[str]:
    """A wheel's unconditional requirements that apply to `python_version` on Linux."""
    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        text = archive.read(metadata).decode()
    environment = {"python_version": python_version, "python_full_version": python_version + ".0",
                   "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
                   "platform_machine": "x86_64", "implementation_name": "cpython",
                   "platform_python_implementation": "CPython", "extra": ""}
    found = []
    for line in text.splitlines():
        if line.startswith("Requires-Dist:"):
            requirement = Requirement(line.split(":", 1)[1].strip())
            if requirement.marker is None or requirement.marker.evaluate(environment):
                found.append(str(requirement))
    return found


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _strip(data: bytes) -> bytes:
    """An ELF file without its symbol table (`strip --strip-unneeded`); unchanged without strip."""
    if not shutil.which("strip"):
        return data
    with tempfile.TemporaryDirectory(prefix="device-bundle-strip-") as folder:
        path = os.path.join(folder, "binary")
        with open(path, "wb") as f:
            f.write(data)
        subprocess.run(["strip", "--strip-unneeded", path], check=True)
        with open(path, "rb") as f:
            return f.read()


def repack(source: str, target: str, dropped=(), strip: bool = False) -> tuple[int, int]:
    """Copy the wheel `source` to `target` without the paths `dropped` matches, its ELF files
    stripped with `strip`, each file LZMA-compressed, and a RECORD that lists exactly what is
    left with its sha256 and size. Returns (files kept, files dropped).

    LZMA is a compression method of the ZIP format that pip reads (it unpacks wheels with
    Python's zipfile): Ray's binaries take 25% less room than with deflate."""
    kept = removed = 0
    with zipfile.ZipFile(source) as wheel_in, zipfile.ZipFile(target, "w", compression=zipfile.ZIP_LZMA) as wheel_out:
        record_name = next(n for n in wheel_in.namelist() if n.endswith(".dist-info/RECORD"))
        rows = []
        for info in wheel_in.infolist():
            if info.filename == record_name or info.is_dir():
                continue
            if any(pattern.search(info.filename) for pattern in dropped):
                removed += 1
                continue
            data = wheel_in.read(info)
            if strip and data[:4] == b"\x7fELF":
                data = _strip(data)
            entry = zipfile.ZipInfo(info.filename, date_time=info.date_time)
            entry.external_attr = info.external_attr  # keeps the binaries executable
            entry.compress_type = zipfile.ZIP_LZMA
            wheel_out.writestr(entry, data)
            rows.append((info.filename, _record_hash(data), str(len(data))))
            kept += 1
        rows.append((record_name, "", ""))
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows(rows)
        wheel_out.writestr(zipfile.ZipInfo(record_name, date_time=(2020, 1, 1, 0, 0, 0)), out.getvalue())
    return kept, removed


def tree_bytes(root: str = REPO) -> int:
    """What the working tree sends besides the bundle: its tracked and untracked-not-ignored files."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=root, capture_output=True, check=True).stdout.split(b"\0")
    total = 0
    for name in filter(None, listed):
        path = os.path.join(root, name.decode())
        if os.path.isfile(path):
            total += os.path.getsize(path)
    return total


def mib(n: int) -> str:
    return f"{n / 2**20:6.1f} MiB"


def build(out: str, python_version: str, arch: str, python: str) -> int:
    image = read_image()
    project = read_project()
    ray_requirement = next(r for r in project["dependencies"] if requirement_name(r) == "ray")
    wanted = [ray_requirement]
    for requirement in project["dependencies"] + project["deepspeed"]:
        name = requirement_name(requirement)
        if name not in image and name not in ("ray", "deepspeed"):
            wanted.append(requirement)

    work = tempfile.mkdtemp(prefix="device-bundle-")
    try:
        built = os.path.join(work, "built")
        os.makedirs(built)
        deepspeed = build_deepspeed_wheel(python, project["deepspeed"][0], built)
        for requirement in wheel_requirements(deepspeed, python_version):
            if requirement_name(requirement) not in image:
                wanted.append(requirement)
        wanted += project["build"] + ["pip"]

        downloads = os.path.join(work, "downloads")
        tags = [arg for tag in platforms(arch) for arg in ("--platform", tag)]
        pip(python, "download", "--quiet", "--only-binary=:all:", "--python-version", python_version,
            "--implementation", "cp", *tags, "-d", downloads, *wanted)

        if os.path.isdir(out):
            shutil.rmtree(out)
        os.makedirs(out)
        carried, left_to_image = [], []
        for name in sorted(os.listdir(downloads)):
            path = os.path.join(downloads, name)
            package = canonical(name.split("-")[0])
            if NEVER.match(package):
                raise SystemExit(f"device_bundle: {name} was resolved, and the image's own must be used: "
                                 "a requirement pulls it in; pin that requirement or list it in bench/gpu_image.txt")
            size = os.path.getsize(path)
            if package in image and size > LARGE_MIB * 2**20:
                left_to_image.append((name, size))
            elif package == "pip":  # run as `python pip-*.whl/pip` where there is no pip: zipimport needs deflate
                shutil.copy2(path, os.path.join(out, name))
                carried.append(name)
            else:
                target = os.path.join(out, name)
                if package == "ray":
                    kept, removed = repack(path, target, RAY_DROPPED, strip=True)
                    print(f"ray: {removed} files left out, {kept} kept: {mib(size)} -> {mib(os.path.getsize(target))}")
                else:
                    repack(path, target)
                carried.append(name)
        repack(deepspeed, os.path.join(out, os.path.basename(deepspeed)))
        carried.append(os.path.basename(deepspeed))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"\nbundle {out} (Python {python_version}, {arch}):")
    for name in sorted(carried, key=lambda n: -os.path.getsize(os.path.join(out, n))):
        print(f"  {mib(os.path.getsize(os.path.join(out, name)))}  {name}")
    for name, size in left_to_image:
        print(f"  left to the image ({mib(size).strip()}): {name}")
    bundle = sum(os.path.getsize(os.path.join(out, n)) for n in carried)
    tree = tree_bytes()
    total = bundle + tree
    print(f"\nbundle {mib(bundle).strip()} + working tree {mib(tree).strip()} = {mib(total).strip()} "
          f"of the {LIMIT_MIB:.0f} MiB a device call carries ({len(carried)} wheels)")
    if total > LIMIT_MIB * 2**20:
        print(f"device_bundle: over the limit by {mib(total - int(LIMIT_MIB * 2**20)).strip()}")
        return 1
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python-version", default="3.12", help="the target's Python (the GPU image: 3.12)")
    parser.add_argument("--arch", default="x86_64", help="the target's machine (uname -m)")
    parser.add_argument("--out", default=os.path.join(REPO, ".whl"), help="the bundle's folder (rebuilt)")
    args = parser.parse_args()
    if not re.fullmatch(r"3\.\d+", args.python_version):
        parser.error(f"--python-version takes MAJOR.MINOR, e.g. 3.12; got {args.python_version!r}")
    return build(os.path.abspath(args.out), args.python_version, args.arch, sys.executable)


if __name__ == "__main__":
    sys.exit(main())
