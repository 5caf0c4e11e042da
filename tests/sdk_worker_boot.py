"""A stand-in for the boot program of Beam's SDK container, for a worker pool started without Docker
(``python -m apache_beam.runners.worker.worker_pool_main --container_executable=...``).

The worker pool runs it with the container contract's flags (``--id``, ``--provision_endpoint``,
``--artifact_endpoint``, ``--logging_endpoint``, ``--control_endpoint``). Like the container's boot program it asks
the provision service for the job's options and dependencies, fetches the staged files through the artifact
retrieval API, pip-installs the sdist that ``--setup_file`` staged (``workflow.tar.gz``), then becomes the SDK
worker (``apache_beam.runners.worker.sdk_worker_main``) with that installation on its path and nothing else of the
launcher's. The installation is kept per content of the sdist (under ``--semi_persist_dir``), so the workers of
later jobs with the same code start without installing again.

It imports only Beam and the standard library: it runs in the workers' environment, which has no project code.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import grpc
from apache_beam.portability import common_urns
from apache_beam.portability.api import (
    beam_artifact_api_pb2,
    beam_artifact_api_pb2_grpc,
    beam_provision_api_pb2,
    beam_provision_api_pb2_grpc,
    beam_runner_api_pb2,
)
from google.protobuf import json_format

WORKFLOW = "workflow.tar.gz"  # the name Beam's stager gives the sdist built from --setup_file
WORKER_MAIN = "apache_beam.runners.worker.sdk_worker_main"


def parse_flags(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    for flag in ("--id", "--provision_endpoint", "--artifact_endpoint", "--logging_endpoint", "--control_endpoint"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--semi_persist_dir", default="/tmp")
    return parser.parse_args(argv)


def provision_info(endpoint: str, worker_id: str) -> beam_provision_api_pb2.ProvisionInfo:
    """The job's options and dependencies, as the runner gives them to this worker."""
    with grpc.insecure_channel(endpoint) as channel:
        stub = beam_provision_api_pb2_grpc.ProvisionServiceStub(channel)
        return stub.GetProvisionInfo(beam_provision_api_pb2.GetProvisionInfoRequest(),
                                     metadata=[("worker_id", worker_id)]).info


def staged_name(artifact: beam_runner_api_pb2.ArtifactInformation) -> str | None:
    """The file name the launcher staged ``artifact`` under (None: not a file to stage)."""
    if artifact.role_urn != common_urns.artifact_roles.STAGING_TO.urn:
        return None
    payload = beam_runner_api_pb2.ArtifactStagingToRolePayload.FromString(artifact.role_payload)
    return os.path.basename(payload.staged_name)


def fetch_artifacts(endpoint: str, worker_id: str, dependencies: list, directory: Path) -> list[Path]:
    """Every staged dependency of the job, written to ``directory`` under its staged name."""
    directory.mkdir(parents=True, exist_ok=True)
    metadata = [("worker_id", worker_id)]
    fetched = []
    with grpc.insecure_channel(endpoint, options=[("grpc.max_receive_message_length", -1)]) as channel:
        stub = beam_artifact_api_pb2_grpc.ArtifactRetrievalServiceStub(channel)
        resolved = stub.ResolveArtifacts(beam_artifact_api_pb2.ResolveArtifactsRequest(artifacts=dependencies),
                                         metadata=metadata).replacements
        for artifact in resolved:
            name = staged_name(artifact)
            if name is None:
                continue
            with open(directory / name, "wb") as out:
                for chunk in stub.GetArtifact(beam_artifact_api_pb2.GetArtifactRequest(artifact=artifact),
                                              metadata=metadata):
                    out.write(chunk.data)
            fetched.append(directory / name)
    return fetched


def content_digest(sdist: Path) -> str:
    """A digest of the sdist's member names and bytes (not of the archive, whose times change with every build)."""
    digest = hashlib.sha256()
    with tarfile.open(sdist) as archive:
        for member in sorted(archive.getmembers(), key=lambda item: item.name):
            if member.isfile():
                digest.update(member.name.encode() + b"\0")
                digest.update(archive.extractfile(member).read())
    return digest.hexdigest()[:16]


def installed(sdist: Path, root: Path) -> Path:
    """The directory the sdist is pip-installed into (no dependencies: the workers' environment has them)."""
    target = root / "installed" / content_digest(sdist)
    if not (target / ".complete").exists():
        partial = target.with_name(f"{target.name}.{os.getpid()}")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--disable-pip-version-check", "--target", str(partial), str(sdist)],
                       check=True, stdout=sys.stderr)
        (partial / ".complete").touch()
        with contextlib.suppress(OSError):  # another worker installed the same sdist first
            partial.rename(target)
    return target


def main(argv: list[str]) -> None:
    flags = parse_flags(argv)
    root = Path(flags.semi_persist_dir)
    info = provision_info(flags.provision_endpoint, flags.id)
    fetched = root / "artifacts" / f"{flags.id}-{os.getpid()}"  # worker ids repeat from job to job
    files = fetch_artifacts(flags.artifact_endpoint, flags.id, list(info.dependencies), fetched)
    paths = [str(installed(path, root)) for path in files if path.name == WORKFLOW]
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(paths),
        "WORKER_ID": flags.id,
        "PIPELINE_OPTIONS": json_format.MessageToJson(info.pipeline_options),
        "SEMI_PERSISTENT_DIRECTORY": str(root),
        "LOGGING_API_SERVICE_DESCRIPTOR": f'url: "{flags.logging_endpoint}"',
        "CONTROL_API_SERVICE_DESCRIPTOR": f'url: "{flags.control_endpoint}"',
        "RUNNER_CAPABILITIES": " ".join(info.runner_capabilities),
    }
    if info.HasField("status_endpoint"):
        environment["STATUS_API_SERVICE_DESCRIPTOR"] = f'url: "{info.status_endpoint.url}"'
    os.chdir(root)
    os.execve(sys.executable, [sys.executable, "-m", WORKER_MAIN], environment)


if __name__ == "__main__":
    main(sys.argv[1:])
