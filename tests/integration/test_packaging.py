"""wal_delivery installs as Postgres extensions do: `make deb` builds the Debian packages
with the Postgres packaging tools, and their files are where the server looks for them
(the paths of pg_config) and where the systemd unit runs the workers from; the extracted
wal-worker runs and knows its version. META.json is a valid PGXN description of this
version, and LICENSE is the PostgreSQL License.

The packages are checked from their archives (dpkg-deb, and dpkg -x into a temporary
directory), not installed: installing would replace the extension that `make install`
put into this machine's Postgres, which other test runs use."""
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VERSION = re.search(r"^default_version\s*=\s*'([^']+)'", (ROOT / "wal_delivery.control").read_text(),
                    re.M).group(1)


# The Postgres under test: Debian 12's 15, or another that make PG=N exported.
PG = os.environ.get("PG", "15")
PG_CONFIG = os.environ.get("PG_CONFIG") or "pg_config"
EXTENSION_PACKAGE = f"postgresql-{PG}-wal-delivery"
# Where Debian's postgresql-N package looks for extensions, whichever server is tested.
LIBDIR, EXTDIR = f"/usr/lib/postgresql/{PG}/lib", f"/usr/share/postgresql/{PG}/extension"


def pg_config(flag):
    return subprocess.run([PG_CONFIG, flag], capture_output=True, text=True, check=True).stdout.strip()


def test_meta_json_is_a_pgxn_description_of_this_version():
    meta = json.loads((ROOT / "META.json").read_text())
    for field in ("name", "abstract", "version", "maintainer", "license", "provides", "meta-spec"):
        assert meta.get(field), f"META.json lacks {field}"
    assert meta["meta-spec"]["version"] == "1.0.0"
    assert meta["license"] == "postgresql"
    # PGXN versions are semantic versions: 1.0 is 1.0.0.
    semver = VERSION if VERSION.count(".") == 2 else VERSION + ".0"
    assert meta["version"] == semver
    ext = meta["provides"]["wal_delivery"]
    assert ext["version"] == semver and ext["abstract"]
    assert (ROOT / ext["file"]).is_file() and (ROOT / ext["docfile"]).is_file()
    assert "PostgreSQL" in meta["prereqs"]["runtime"]["requires"]


def test_license_is_the_postgresql_license():
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("PostgreSQL License\n")
    assert "Copyright (c) 2026, the wal_delivery authors" in text
    assert "Permission to use, copy, modify, and distribute this software" in text


def test_debian_package_version_is_the_extensions():
    changelog = (ROOT / "debian" / "changelog").read_text()
    assert changelog.startswith(f"wal-delivery ({VERSION}) ")


def contents(deb):
    """{path: (mode, owner)} of a .deb's files."""
    out = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True).stdout
    files = {}
    for line in out.splitlines():
        mode, owner, *_, path = line.split()
        files[path.removeprefix(".")] = (mode, owner)
    return files


@pytest.fixture(scope="module")
def debs():
    if not (shutil.which("dpkg-buildpackage") and shutil.which("pg_buildext")) and not os.environ.get("CI"):
        pytest.skip("no Debian packaging tools (tests/setup installs them)")
    out = subprocess.run(["make", "-s", f"PG={PG}", "deb"], cwd=ROOT, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    deb_dir = ROOT / "build" / ("deb" if PG == "15" else f"deb-pg{PG}")
    built = {p.name.split("_")[0]: p for p in deb_dir.glob(f"*_{VERSION}_*.deb")}
    assert {EXTENSION_PACKAGE, "wal-delivery-worker"} <= set(built), built
    return built


def test_extension_package_puts_its_files_where_postgres_looks(debs, tmp_path):
    deb = debs[EXTENSION_PACKAGE]
    files = contents(deb)
    libdir, extdir = LIBDIR, EXTDIR
    if PG == "15":  # Debian's own server: its pg_config says the same
        assert (libdir, extdir) == (pg_config("--pkglibdir"), pg_config("--sharedir") + "/extension")
    assert f"{libdir}/wal_delivery.so" in files
    assert f"{extdir}/wal_delivery.control" in files
    assert f"{extdir}/wal_delivery--{VERSION}.sql" in files
    for update in (ROOT / "sql" / "updates").glob("*.sql"):
        assert f"{extdir}/{update.name}" in files
    assert not any(p.endswith("/wal-worker") for p in files), "wal-worker belongs to its own package"
    depends = subprocess.run(["dpkg-deb", "-f", str(deb), "Depends"], capture_output=True, text=True).stdout
    assert re.search(rf"\bpostgresql-{PG}\b", depends) and "librdkafka" in depends
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp_path)], check=True)
    installed = (tmp_path / extdir.lstrip("/") / "wal_delivery.control").read_text()
    assert installed == (ROOT / "wal_delivery.control").read_text()


def test_worker_package_has_the_binary_the_unit_and_its_user(debs, tmp_path):
    deb = debs["wal-delivery-worker"]
    files = contents(deb)
    assert files["/usr/bin/wal-worker"][0] == "-rwxr-xr-x"
    assert "/lib/systemd/system/wal-worker@.service" in files
    # The environment file may hold a password and the peer token.
    assert files["/etc/wal-delivery/wal-worker.env"] == ("-rw-------", "root/root")

    control = tmp_path / "control"
    subprocess.run(["dpkg-deb", "-e", str(deb), str(control)], check=True)
    assert "/etc/wal-delivery/wal-worker.env" in (control / "conffiles").read_text()
    assert re.search(r"adduser .*--system .*wal-delivery", (control / "postinst").read_text(), re.S)

    root = tmp_path / "root"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    version = subprocess.run([str(root / "usr/bin/wal-worker"), "--version"], capture_output=True, text=True)
    assert version.stdout == f"wal-worker {VERSION}\n"

    unit = (root / "lib/systemd/system/wal-worker@.service").read_text()
    for line in ("User=wal-delivery", "Restart=on-failure", "EnvironmentFile=/etc/wal-delivery/wal-worker.env",
                 "EnvironmentFile=-/etc/wal-delivery/wal-worker-%i.env", "Environment=WAL_WORKER_ROLE=%i",
                 "ExecStart=/usr/bin/wal-worker ${WAL_WORKER_ROLE} $WAL_WORKER_OPTIONS",
                 "Type=notify", "WatchdogSec=60s"):
        assert f"\n{line}\n" in unit, line
    if shutil.which("systemd-analyze"):
        # An instance of the unit, pointed at the extracted binary, passes systemd's checks.
        instance = tmp_path / "wal-worker@consume.service"
        instance.write_text(unit.replace("/usr/bin/wal-worker", str(root / "usr/bin/wal-worker")))
        check = subprocess.run(["systemd-analyze", "verify", str(instance)], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr


@pytest.fixture
def pg_tmp():
    """A directory the postgres user can reach (pytest's tmp_path is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="wal-packaging-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_extension_package_runs_in_its_postgres(debs, pg_tmp):
    """The packaged library is built for the server it is packaged for: a copy of that
    server with the package's files in its directories preloads it and creates the
    extension."""
    tmp_path = pg_tmp
    root = tmp_path / "deb"
    subprocess.run(["dpkg-deb", "-x", str(debs[EXTENSION_PACKAGE]), str(root)], check=True)
    server = tmp_path / "server"
    if PG == "15":
        exports = subprocess.run([str(ROOT / "tests/pg-prefix"), str(server)], capture_output=True,
                                 text=True, check=True).stdout
        bindir = Path(re.search(r"PGBIN='([^']+)'", exports).group(1))
    else:
        shutil.copytree(Path(pg_config("--bindir")).parent, server, symlinks=True)
        bindir = server / "bin"
    config = str(bindir / "pg_config")
    libdir = Path(subprocess.run([config, "--pkglibdir"], capture_output=True, text=True).stdout.strip())
    extdir = Path(subprocess.run([config, "--sharedir"], capture_output=True, text=True).stdout.strip()) / "extension"
    shutil.copy2(root / LIBDIR.lstrip("/") / "wal_delivery.so", libdir)
    for f in (root / EXTDIR.lstrip("/")).iterdir():
        shutil.copy2(f, extdir)
    data, sock = tmp_path / "data", tmp_path / "sock"
    as_pg = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    for d in (data, sock):
        d.mkdir(mode=0o700)
        if as_pg:
            shutil.chown(d, "postgres")
    subprocess.run([*as_pg, str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
                    "--no-sync"], check=True, capture_output=True)
    with open(data / "postgresql.conf", "a") as conf:
        conf.write(f"listen_addresses = ''\nunix_socket_directories = '{sock}'\n"
                   "shared_preload_libraries = 'wal_delivery'\n")
    subprocess.run([*as_pg, str(bindir / "pg_ctl"), "-D", str(data), "-l", str(data / "log"), "-w", "start"],
                   check=True, capture_output=True)
    try:
        run = [*as_pg, str(bindir / "psql"), "-h", str(sock), "-U", "postgres", "-d", "postgres", "-Atc"]
        subprocess.run([*run, "CREATE EXTENSION wal_delivery"], check=True, capture_output=True)
        out = subprocess.run([*run, "SELECT wal_delivery.library_version(), current_setting('server_version_num')"],
                             check=True, capture_output=True, text=True).stdout.strip()
        assert out.split("|")[0] == VERSION and out.split("|")[1].startswith(PG), out
    finally:
        subprocess.run([*as_pg, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                       capture_output=True)
