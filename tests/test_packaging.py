"""Remote Beam workers install the project from the sdist Beam builds out of its setup.py (`--setup_file`, which the
launcher adds itself when it runs from a checkout); an installation without one refuses such workers in one line."""

from __future__ import annotations

import subprocess
import sys
import tarfile

from apache_beam.runners.portability.stager import Stager

from tests.conftest import BUNDLED_SAMPLE, REPO

PACKAGES = ("pipelines", "transforms", "encoders", "artifacts")


def test_beam_builds_an_installable_sdist_of_every_package(tmp_path):
    tarball = Stager._build_setup_package(str(REPO / "setup.py"), str(tmp_path / "build"))
    with tarfile.open(tarball) as archive:
        names = archive.getnames()
    for package in PACKAGES:
        assert any(name.endswith(f"/{package}/__init__.py") for name in names), package
    assert any(name.endswith("/pipelines/parse.py") for name in names)
    assert any(name.endswith("/run_pipeline.py") for name in names)

    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(target), tarball], check=True)
    probe = ("import pipelines.parse, transforms.parse.redirects, artifacts.run.manifest, encoders.models; "
             "print(pipelines.parse.__file__)")
    printed = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env={"PYTHONPATH": str(target)},
                             capture_output=True, text=True, check=True).stdout
    assert printed.startswith(str(target))

    # That installation has no setup.py to ship: workers that are not its own processes are refused, in one line.
    remote = ["--runner=PortableRunner", "--job_endpoint=localhost:8099", "--environment_type=EXTERNAL",
              "--environment_config=localhost:50000"]
    run = subprocess.run([sys.executable, "-m", "run_pipeline", "parse", "--dump", str(BUNDLED_SAMPLE), "--output",
                          str(tmp_path / "out"), *remote], cwd=tmp_path, env={"PYTHONPATH": str(target)},
                         capture_output=True, text=True)
    assert (run.returncode, run.stderr.splitlines()) == (2, [
        "error: the workers of --runner PortableRunner do not have this project, and this installation has no "
        "setup.py to ship it from: add --setup_file=CHECKOUT/setup.py (a checkout of kpr-pipeline), or "
        "--sdk_container_image=IMAGE with kpr-pipeline installed"])
    assert not (tmp_path / "out").exists()
