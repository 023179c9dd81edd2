"""The worker's CA bundle as a layer of Docker images: what an image trusts is what the worker trusts.

An image bootstrapped from Debian packages has only Debian's bundle, so behind a TLS-inspecting proxy (or with a
registry mirror behind an operator's CA) ``pip install`` and ``npm ci`` inside it fail with
``CERTIFICATE_VERIFY_FAILED``. So the worker's bundle (:class:`environments.ca_bundle.CABundle`) is added the
Debian way, as an image of its own between the base image and the app images
(:meth:`environments.docker.images.ImageBuilder.ensure_trust`): copied to :data:`IMAGE_CA_FILE` under
``/usr/local/share/ca-certificates`` and folded into the image's own bundle by ``update-ca-certificates`` (the
``ca-certificates`` package's tool; an image without that package gets no such layer). Its tag is keyed by the
base image and the bundle's SHA-256, so a second build reuses it and a changed bundle makes a new one. The
variables tools read a bundle's path from (:data:`environments.ca_bundle.CA_VARIABLES`) are set in the layer to
the image's paths, never to the worker's: setup containers, app and test containers all inherit them.
"""

from __future__ import annotations

import hashlib
import json

from environments.ca_bundle import CA_VARIABLES, CABundle

# Where the worker's bundle goes in the image: update-ca-certificates reads every *.crt in this directory.
IMAGE_CA_FILE = "/usr/local/share/ca-certificates/durafix-worker-ca.crt"
TRUST_REPOSITORY = "durafix/trust"
# What a base image needs for the layer: update-ca-certificates.
CA_PACKAGE = "ca-certificates"
# The layer's own format: a change to how it is made makes new tags.
_FORMAT = 1


def trust_tag(base_id: str, bundle: CABundle) -> str:
    """The layer's tag over the base image ``base_id``: keyed by that image and the bundle's digest."""
    canonical = json.dumps({"format": _FORMAT, "base": base_id, "bundle": bundle.digest}, sort_keys=True)
    return f"{TRUST_REPOSITORY}:{hashlib.sha256(canonical.encode()).hexdigest()[:16]}"


def trust_dockerfile(base_tag: str, source: str, bundle: CABundle) -> str:
    """The layer's Dockerfile: the bundle (``source`` in the build context) copied to :data:`IMAGE_CA_FILE`,
    ``update-ca-certificates`` run (as root: durafix's own step, never the recipe's), the variables set."""
    variables = " ".join(f"{name}={value}" for name, value in CA_VARIABLES.items())
    return (
        f"FROM {base_tag}\n"
        f"COPY {source} {IMAGE_CA_FILE}\n"
        'RUN ["update-ca-certificates"]\n'
        f"ENV {variables}\n"
        f"LABEL durafix.ca-bundle=sha256:{bundle.digest}\n"
    )
