"""The production manifests under infra/deploy/kubernetes: valid Kubernetes objects, and consistent with durafix.

Each document is validated against the Kubernetes schemas of :data:`KUBERNETES_VERSION` (the strict ones, so
an unknown or misspelt field fails), offline, from the schemas kubernetes-validate ships. Then what no schema
can see: every Secret or ConfigMap key a pod refers to is one the ConfigMap or the example Secrets define,
every ``DURAFIX_*``/``OPENAI_*`` variable is a real setting, every worker polls real queues, every autoscaler
scales an existing Deployment on the backlog of a queue that Deployment polls, every file a setting names is
mounted from a Secret in each container that reads it, kustomization.yaml applies every manifest but the
examples, every pod is held by a default-deny NetworkPolicy and one of its own that opens only what its
component needs (the sandbox's pod reaching the setup egress proxy and no other pod), and the Temporal values
turn on mTLS. The same checks run on broken copies, so each can be seen to fail.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from evidence.serve import TOKEN_VARIABLE as EVIDENCE_TOKEN_ENV
from pipeline.cli.forge import ADMIN_TOKEN_ENV, OWNER_TOKEN_ENV
from pipeline.config import _ENV
from pipeline.steps import TaskQueue
from pipeline.worker.queue_settings import parse_queues

ROOT = Path(__file__).resolve().parents[3]
MANIFESTS = ROOT / "infra" / "deploy" / "kubernetes"
EXAMPLES = MANIFESTS / "examples"
TEMPORAL_VALUES = ROOT / "infra" / "deploy" / "temporal-values.yaml"
DEPLOY_DOC = ROOT / "docs" / "deploy.md"

KUBERNETES_VERSION = "1.31.0"
"""The oldest Kubernetes the manifests are written for (``appArmorProfile`` in a securityContext is 1.30+)."""

PARALLEL_SETTINGS = {
    "DURAFIX_GITHUB_APP_ID": "github_app_id",
    "DURAFIX_GITHUB_APP_PRIVATE_KEY_FILE": "github_app_private_key_file",
    "DURAFIX_GITHUB_APP_INSTALLATION_ID": "github_app_installation_id",
    "DURAFIX_QUEUE_SETTINGS": "queue_settings",
}
"""Settings the manifests use that are being added to ``pipeline/config.py`` on another branch, with these
names and keys; once there, :func:`test_parallel_settings_keep_their_names` holds them to it."""

PROCESS_VARIABLES = {"DURAFIX_STATE_DIR", OWNER_TOKEN_ENV, ADMIN_TOKEN_ENV, EVIDENCE_TOKEN_ENV}
"""Variables durafix reads that are not ``config.json`` settings (the state directory; the setup tokens; the
evidence server's token)."""

SETTINGS = {**PARALLEL_SETTINGS, **_ENV}

EGRESS_PROXY = {"app.kubernetes.io/name": "durafix-egress"}
"""The pods of the setup egress proxy (``durafix-egress``, port :data:`EGRESS_PROXY_PORT`), whose Deployment is
being built on another branch: the one pod a NetworkPolicy may name that no manifest here defines."""
EGRESS_PROXY_PORT = 3128

COMPONENT_EGRESS_PORTS = {
    "durafix-receiver": {7233, 443},
    "durafix-reconciler": {7233, 443},
    "durafix-worker-orchestration": {7233},
    "durafix-worker-forge": {7233, 443},
    "durafix-worker-model": {7233, 443},
    "durafix-worker-environments": {7233, 443, EGRESS_PROXY_PORT},
    "durafix-evidence": {443},
}
"""The ports each component's own policy opens (beyond DNS): Temporal, HTTPS (the forge, S3, the model
endpoint), and for the sandbox's pod the egress proxy."""

# What a public-address ipBlock must leave out: the cluster's and the node's private ranges, and link-local
# (the cloud metadata service, whose credentials are the node's).
PRIVATE_V4 = {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "127.0.0.0/8"}
PRIVATE_V6 = {"fc00::/7", "fe80::/10", "::1/128"}
_OURS = re.compile(r"^(DURAFIX|OPENAI)_")

Doc = dict[str, Any]


@dataclass(frozen=True)
class Manifest:
    file: str
    """The path under infra/deploy/kubernetes."""
    doc: Doc

    @property
    def ident(self) -> str:
        return f"{self.file}: {self.doc.get('kind')}/{self.doc.get('metadata', {}).get('name')}"


def load(directory: Path = MANIFESTS) -> list[Manifest]:
    """Every document of every YAML file under ``directory`` (the examples included), kustomization aside."""
    out: list[Manifest] = []
    for path in sorted(directory.rglob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                out.append(Manifest(str(path.relative_to(directory)), doc))
    return out


def schema_errors(manifest: Manifest) -> list[str]:
    """What the strict schema of the pinned Kubernetes version refuses in ``manifest``."""
    try:
        kubernetes_validate.validate(manifest.doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as err:
        where = "/".join(str(part) for part in err.path)
        return [f"{manifest.ident}: {where}: {err.message}"]
    except kubernetes_validate.SchemaNotFoundError as err:
        return [f"{manifest.ident}: {err.message}"]
    return []


def _of_kind(manifests: list[Manifest], kind: str) -> Iterator[Manifest]:
    return (m for m in manifests if m.doc.get("kind") == kind)


def _containers(pod_spec: Doc) -> list[Doc]:
    return [*pod_spec.get("initContainers", []), *pod_spec.get("containers", [])]


def _flag(args: list[str], name: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(f"{name}="):
            return arg.partition("=")[2]
    return None


def reference_errors(manifests: list[Manifest]) -> list[str]:
    """What the schemas cannot see: references to Secrets, ConfigMaps, Deployments and ServiceAccounts that
    nothing defines, variables that are no setting, queues that do not exist, autoscalers of nothing."""
    errors: list[str] = []
    secrets = {
        m.doc["metadata"]["name"]: {*m.doc.get("data", {}), *m.doc.get("stringData", {})}
        for m in _of_kind(manifests, "Secret")
    }
    config_maps = {m.doc["metadata"]["name"]: set(m.doc.get("data", {})) for m in _of_kind(manifests, "ConfigMap")}
    accounts = {m.doc["metadata"]["name"] for m in _of_kind(manifests, "ServiceAccount")}
    polled: dict[str, set[str]] = {}

    def key_ref(where: str, kind: str, known: dict[str, set[str]], ref: Doc) -> None:
        name, key = ref.get("name"), ref.get("key")
        if name not in known:
            errors.append(f"{where}: no {kind} {name!r} is defined")
        elif key is not None and key not in known[name]:
            errors.append(f"{where}: {kind} {name!r} defines no key {key!r}")

    def variable(where: str, name: str) -> None:
        if _OURS.match(name) and name not in SETTINGS and name not in PROCESS_VARIABLES:
            errors.append(f"{where}: {name} is no durafix setting (pipeline/config.py _ENV) or process variable")

    for m in _of_kind(manifests, "ConfigMap"):
        for name in m.doc.get("data", {}):
            variable(m.ident, name)

    for m in _of_kind(manifests, "Deployment"):
        pod = m.doc["spec"]["template"]["spec"]
        account = pod.get("serviceAccountName")
        if account is not None and account not in accounts:
            errors.append(f"{m.ident}: no ServiceAccount {account!r} is defined")
        for volume in pod.get("volumes", []):
            where = f"{m.ident}: volume {volume['name']}"
            if "secret" in volume:
                ref = volume["secret"]
                key_ref(where, "Secret", secrets, {"name": ref.get("secretName")})
                for item in ref.get("items", []):
                    key_ref(where, "Secret", secrets, {"name": ref.get("secretName"), "key": item["key"]})
            if "configMap" in volume:
                ref = volume["configMap"]
                for item in [*ref.get("items", []), {"key": None}]:
                    key_ref(where, "ConfigMap", config_maps, {"name": ref.get("name"), "key": item["key"]})
        queues: set[str] = set()
        for container in _containers(pod):
            where = f"{m.ident}: container {container['name']}"
            for source in container.get("envFrom", []):
                if "secretRef" in source:
                    key_ref(where, "Secret", secrets, source["secretRef"])
                if "configMapRef" in source:
                    key_ref(where, "ConfigMap", config_maps, source["configMapRef"])
            for env in container.get("env", []):
                variable(where, env["name"])
                value_from = env.get("valueFrom", {})
                if "secretKeyRef" in value_from:
                    key_ref(f"{where}: {env['name']}", "Secret", secrets, value_from["secretKeyRef"])
                if "configMapKeyRef" in value_from:
                    key_ref(f"{where}: {env['name']}", "ConfigMap", config_maps, value_from["configMapKeyRef"])
            args = [*container.get("command", []), *container.get("args", [])]
            if args[:1] == ["worker"]:
                value = _flag(args, "--queues")
                if value is None:
                    errors.append(f"{where}: a worker without --queues polls every queue; name its queues")
                    continue
                try:
                    queues.update(q.value for q in parse_queues(value))
                except ValueError as err:
                    errors.append(f"{where}: --queues {value}: {err}")
        polled[m.doc["metadata"]["name"]] = queues

    for m in _of_kind(manifests, "HorizontalPodAutoscaler"):
        target = m.doc["spec"]["scaleTargetRef"]
        if target.get("kind") != "Deployment" or target.get("name") not in polled:
            errors.append(f"{m.ident}: scales {target.get('kind')}/{target.get('name')}, which is not defined")
            continue
        for metric in m.doc["spec"].get("metrics", []):
            labels = metric.get("external", {}).get("metric", {}).get("selector", {}).get("matchLabels", {})
            queue = labels.get("task_queue")
            if queue is not None and queue not in polled[target["name"]]:
                errors.append(f"{m.ident}: scales on the backlog of {queue!r}, which {target['name']} does not poll")

    for m in _of_kind(manifests, "Ingress"):
        for tls in m.doc["spec"].get("tls", []):
            key_ref(f"{m.ident}: tls", "Secret", secrets, {"name": tls.get("secretName")})
    return errors


FORGE_QUEUES = {TaskQueue.FORGE, TaskQueue.MODEL, TaskQueue.ENVIRONMENTS}
"""The queues whose activities call GitHub or clone from it (the workspaces come from the forge's git)."""


def _reads_forge(args: list[str]) -> bool:
    if args[:1] == ["worker"]:
        try:
            return bool(set(parse_queues(_flag(args, "--queues") or "")) & FORGE_QUEUES)
        except ValueError:  # reference_errors reports the queue
            return False
    return args[:1] in (["serve"], ["reconcile"])


FILE_READERS: dict[str, Callable[[list[str]], bool]] = {
    "DURAFIX_TEMPORAL_": lambda args: True,
    "DURAFIX_GITHUB_APP_": _reads_forge,
}
"""Which processes (by their arguments) read the files that settings with these prefixes name."""


def file_errors(manifests: list[Manifest]) -> list[str]:
    """Every ``*_FILE`` setting of the ConfigMap names a file that each container reading it mounts: the
    setting's directory is the mount path of a Secret volume that holds a key of the file's name."""
    errors: list[str] = []
    secrets = {
        m.doc["metadata"]["name"]: {*m.doc.get("data", {}), *m.doc.get("stringData", {})}
        for m in _of_kind(manifests, "Secret")
    }
    for config_map in _of_kind(manifests, "ConfigMap"):
        files = {k: Path(v) for k, v in config_map.doc.get("data", {}).items() if k.endswith("_FILE") and v}
        for setting, path in files.items():
            readers = [reads for prefix, reads in FILE_READERS.items() if setting.startswith(prefix)]
            if not readers:
                errors.append(f"{config_map.ident}: {setting}: no process is known to read it (FILE_READERS)")
                continue
            for m in _of_kind(manifests, "Deployment"):
                pod = m.doc["spec"]["template"]["spec"]
                volumes = {v["name"]: v for v in pod.get("volumes", [])}
                for container in _containers(pod):
                    args = [*container.get("command", []), *container.get("args", [])]
                    sources = [s.get("configMapRef", {}).get("name") for s in container.get("envFrom", [])]
                    if config_map.doc["metadata"]["name"] not in sources or not readers[0](args):
                        continue
                    held: set[str] = set()
                    for mount in container.get("volumeMounts", []):
                        secret = volumes.get(mount["name"], {}).get("secret")
                        if secret is None or Path(mount["mountPath"]) != path.parent:
                            continue
                        items = secret.get("items")
                        held |= {i["path"] for i in items} if items else secrets.get(secret.get("secretName"), set())
                    if path.name not in held:
                        errors.append(f"{m.ident}: container {container['name']} does not mount {path} ({setting})")
    return errors


def kustomization_errors(kustomization: Doc, manifests: list[Manifest]) -> list[str]:
    """kustomization.yaml must apply every manifest file, and never an example (Secrets are the operator's)."""
    listed = set(kustomization.get("resources", []))
    files = {m.file for m in manifests}
    errors = [f"kustomization.yaml applies {name}, an example" for name in sorted(listed) if "example" in name]
    errors += [f"kustomization.yaml lists {name}, which does not exist" for name in sorted(listed - files)]
    errors += [
        f"{name} is not in kustomization.yaml" for name in sorted(files - listed) if not name.startswith("examples/")
    ]
    return errors


def _selects(selector: Doc, labels: Doc) -> bool:
    wanted = selector.get("matchLabels", {})
    return all(labels.get(key) == value for key, value in wanted.items()) and not selector.get("matchExpressions")


def _ports(rule: Doc) -> set[int]:
    return {int(port["port"]) for port in rule.get("ports", [])}


def network_policy_errors(manifests: list[Manifest]) -> list[str]:
    """Default deny for the namespace; each Deployment's pods selected by a policy of its name that opens
    only :data:`COMPONENT_EGRESS_PORTS`; no policy naming pods that nothing runs (but the egress proxy); the
    only pod any durafix pod may reach is the egress proxy, and only from the environments pods on its port;
    public ipBlocks leave out the private and link-local ranges; ingress only to the receiver's port."""
    errors: list[str] = []
    policies = list(_of_kind(manifests, "NetworkPolicy"))
    pods = {
        m.doc["metadata"]["name"]: m.doc["spec"]["template"]["metadata"]["labels"]
        for m in _of_kind(manifests, "Deployment")
    }
    if not any(
        p.doc["spec"]["podSelector"] == {}
        and set(p.doc["spec"].get("policyTypes", [])) == {"Ingress", "Egress"}
        and not p.doc["spec"].get("ingress")
        and not p.doc["spec"].get("egress")
        for p in policies
    ):
        errors.append("no default-deny NetworkPolicy (podSelector {}, Ingress and Egress, no rules)")
    known = [*pods.values(), EGRESS_PROXY]
    for policy in policies:
        spec = policy.doc["spec"]
        selector = spec["podSelector"]
        if selector and not any(_selects(selector, labels) for labels in known):
            errors.append(f"{policy.ident}: selects pods that no Deployment runs")
        for direction, peers_key in (("ingress", "from"), ("egress", "to")):
            for rule in spec.get(direction, []):
                for peer in rule.get(peers_key, []):
                    block = peer.get("ipBlock")
                    if block is not None and block["cidr"] in ("0.0.0.0/0", "::/0"):
                        private = PRIVATE_V4 if block["cidr"] == "0.0.0.0/0" else PRIVATE_V6
                        missing = sorted(private - set(block.get("except", [])))
                        if missing:
                            errors.append(f"{policy.ident}: {direction} to {block['cidr']} does not except {missing}")
                    if "podSelector" in peer and "namespaceSelector" not in peer:
                        target = peer["podSelector"]
                        if not _selects(target, EGRESS_PROXY) and direction == "egress":
                            errors.append(f"{policy.ident}: egress to the pods {target} (only the egress proxy)")
                        if _selects(target, EGRESS_PROXY) and _ports(rule) != {EGRESS_PROXY_PORT}:
                            errors.append(f"{policy.ident}: the egress proxy on {sorted(_ports(rule))}")
    for name, labels in pods.items():
        own = [p for p in policies if p.doc["metadata"]["name"] == name]
        if not own or not _selects(own[0].doc["spec"]["podSelector"], labels):
            errors.append(f"{name} is selected by no NetworkPolicy of its own")
            continue
        spec = own[0].doc["spec"]
        if set(spec.get("policyTypes", [])) != {"Ingress", "Egress"}:
            errors.append(f"{own[0].ident}: policyTypes must be Ingress and Egress")
        opened = {port for rule in spec.get("egress", []) for port in _ports(rule)}
        expected = COMPONENT_EGRESS_PORTS.get(name)
        if expected is None:
            errors.append(f"{name}: no expected egress in COMPONENT_EGRESS_PORTS")
        elif opened != expected:
            errors.append(f"{own[0].ident}: opens egress ports {sorted(opened)}, expected {sorted(expected)}")
        if any(not rule.get("to") or not rule.get("ports") for rule in spec.get("egress", [])):
            errors.append(f"{own[0].ident}: an egress rule without destinations or ports opens everything")
        reaches_proxy = any(
            _selects(peer.get("podSelector", {"matchLabels": {"-": "-"}}), EGRESS_PROXY)
            for rule in spec.get("egress", [])
            for peer in rule.get("to", [])
        )
        if reaches_proxy != (EGRESS_PROXY_PORT in (expected or set())):
            errors.append(f"{own[0].ident}: reaches the egress proxy: {reaches_proxy}")
        container_ports = {
            int(port["containerPort"])
            for container in _containers(_first_deployment(manifests, name))
            for port in container.get("ports", [])
        }
        for rule in spec.get("ingress", []):
            if not rule.get("from") or not _ports(rule) <= container_ports:
                errors.append(f"{own[0].ident}: ingress {sorted(_ports(rule))} beyond its ports {container_ports}")
    return errors


def _first_deployment(manifests: list[Manifest], name: str) -> Doc:
    pod: Doc = next(m.doc for m in _of_kind(manifests, "Deployment") if m.doc["metadata"]["name"] == name)["spec"][
        "template"
    ]["spec"]
    return pod


@pytest.fixture(scope="module")
def manifests() -> list[Manifest]:
    return load()


def test_every_manifest_is_valid_for_the_pinned_kubernetes(manifests: list[Manifest]) -> None:
    assert {m.doc["kind"] for m in manifests} >= {
        "Namespace",
        "ServiceAccount",
        "ConfigMap",
        "Secret",
        "Deployment",
        "Service",
        "Ingress",
        "HorizontalPodAutoscaler",
        "NetworkPolicy",
    }
    assert [error for m in manifests for error in schema_errors(m)] == []


def test_every_pod_reaches_only_what_its_component_needs(manifests: list[Manifest]) -> None:
    assert network_policy_errors(manifests) == []


def test_references_settings_and_queues_hold(manifests: list[Manifest]) -> None:
    assert reference_errors(manifests) == []


def test_every_file_a_setting_names_is_mounted(manifests: list[Manifest]) -> None:
    assert file_errors(manifests) == []


def test_every_queue_has_a_worker(manifests: list[Manifest]) -> None:
    args = [
        c.get("args", [])
        for m in _of_kind(manifests, "Deployment")
        for c in _containers(m.doc["spec"]["template"]["spec"])
    ]
    polled = {q.value for a in args if a[:1] == ["worker"] for q in parse_queues(_flag(a, "--queues") or "")}
    assert polled == {q.value for q in TaskQueue}


def test_kustomization_applies_every_manifest_but_the_examples(manifests: list[Manifest]) -> None:
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    assert kustomization_errors(kustomization, manifests) == []


def test_temporal_values_use_postgresql_only() -> None:
    values = yaml.safe_load(TEMPORAL_VALUES.read_text())
    stores = values["server"]["config"]["persistence"]
    assert {stores[s]["driver"] for s in ("default", "visibility")} == {"sql"}
    assert {stores[s]["sql"]["driver"] for s in ("default", "visibility")} == {"postgres12"}
    assert not any(values[bundled]["enabled"] for bundled in ("cassandra", "mysql", "elasticsearch"))


def test_temporal_values_require_client_certificates_on_both_listeners() -> None:
    values = yaml.safe_load(TEMPORAL_VALUES.read_text())
    tls = values["server"]["config"]["tls"]
    mounts = {m["name"]: m["mountPath"] for m in values["server"]["additionalVolumeMounts"]}
    secrets = {v["name"]: v["secret"]["secretName"] for v in values["server"]["additionalVolumes"]}
    for listener in ("internode", "frontend"):
        server = tls[listener]["server"]
        assert server["requireClientAuth"] is True, listener
        files = [
            server["certFile"],
            server["keyFile"],
            *server["clientCaFiles"],
            *tls[listener]["client"]["rootCaFiles"],
        ]
        for file in files:
            assert any(file.startswith(path + "/") for path in mounts.values()), file
    assert set(mounts) <= set(secrets)
    # The frontend's own clients inside the chart present the client certificate too.
    for client in ("admintools", "web"):
        env = {e["name"]: e["value"] for e in values[client]["additionalEnv"]}
        assert {"TEMPORAL_TLS_CERT", "TEMPORAL_TLS_KEY", "TEMPORAL_TLS_CA"} <= set(env), client


def test_temporal_values_lower_the_servers_timer_floor() -> None:
    """Every activity retry is a server timer, fired no earlier than now + the time shift (1 s by default): the
    shipped values lower it, so a failed-over attempt runs again within 0.1 s, not up to a second later."""
    values = yaml.safe_load(TEMPORAL_VALUES.read_text())
    [setting] = values["server"]["dynamicConfig"]["history.timerProcessorMaxTimeShift"]
    assert setting == {"value": "100ms", "constraints": {}}


def test_deploy_doc_says_how_the_sandbox_is_kept_and_names_the_egress_proxy() -> None:
    text = " ".join(DEPLOY_DOC.read_text().split())
    for needed in (
        "networkpolicy.yaml",
        "`durafix-egress`",
        "port 3128",
        "setup egress proxy",
        "unprivileged user namespaces",
        "gVisor",
        "requireClientAuth",
    ):
        assert needed in text, needed


def test_parallel_settings_keep_their_names() -> None:
    """A setting of :data:`PARALLEL_SETTINGS` that has landed in ``_ENV`` must have the key the manifests and
    docs were written for."""
    landed = {name: _ENV[name] for name in PARALLEL_SETTINGS if name in _ENV}
    assert landed == {name: PARALLEL_SETTINGS[name] for name in landed}


def test_deploy_doc_names_every_setting() -> None:
    """docs/deploy.md's settings table has a row for every variable of ``_ENV`` (with its config key), the
    settings being added alongside, and the process variables."""
    rows = {
        match.group(1): match.group(2)
        for match in re.finditer(r"^\| `([A-Z0-9_]+)` \| `?([a-z0-9_]*|—)`? \|", DEPLOY_DOC.read_text(), re.M)
    }
    missing = sorted((set(SETTINGS) | PROCESS_VARIABLES) - set(rows))
    assert missing == []
    wrong_key = {name: rows[name] for name, key in SETTINGS.items() if rows[name] != key}
    assert wrong_key == {}


# ---- the checks, on broken copies ----------------------------------------------------------------------


def _first(manifests: list[Manifest], kind: str, name: str) -> Doc:
    return next(m.doc for m in manifests if m.doc["kind"] == kind and m.doc["metadata"]["name"] == name)


def _container(manifests: list[Manifest], deployment: str) -> Doc:
    container: Doc = _first(manifests, "Deployment", deployment)["spec"]["template"]["spec"]["containers"][0]
    return container


def _misspelt_field(ms: list[Manifest]) -> None:
    _container(ms, "durafix-worker-forge")["resource"] = {}


def _unknown_secret_key(ms: list[Manifest]) -> None:
    _container(ms, "durafix-worker-model")["env"][0]["valueFrom"]["secretKeyRef"]["key"] = "apikey"


def _unknown_config_map(ms: list[Manifest]) -> None:
    _container(ms, "durafix-receiver")["envFrom"][0]["configMapRef"]["name"] = "durafix-settings"


def _unknown_setting(ms: list[Manifest]) -> None:
    _first(ms, "ConfigMap", "durafix-config")["data"]["DURAFIX_TEMPORAL_ADRESS"] = "x:7233"


def _unknown_queue(ms: list[Manifest]) -> None:
    _container(ms, "durafix-worker-forge")["args"] = ["worker", "--queues", "forges"]


def _autoscaler_of_nothing(ms: list[Manifest]) -> None:
    _first(ms, "HorizontalPodAutoscaler", "durafix-worker-model")["spec"]["scaleTargetRef"]["name"] = "durafix-model"


def _autoscaler_on_another_queue(ms: list[Manifest]) -> None:
    metric = _first(ms, "HorizontalPodAutoscaler", "durafix-worker-model")["spec"]["metrics"][0]
    metric["external"]["metric"]["selector"]["matchLabels"]["task_queue"] = TaskQueue.FORGE.value


def _temporal_key_not_mounted(ms: list[Manifest]) -> None:
    mounts = _container(ms, "durafix-reconciler")["volumeMounts"]
    mounts[:] = [mount for mount in mounts if mount["name"] != "temporal"]


def _app_key_elsewhere(ms: list[Manifest]) -> None:
    data = _first(ms, "ConfigMap", "durafix-config")["data"]
    data["DURAFIX_GITHUB_APP_PRIVATE_KEY_FILE"] = "/etc/durafix/app/app-private-key.pem"


def _policy(ms: list[Manifest], name: str) -> Doc:
    return _first(ms, "NetworkPolicy", name)


def _policy_dropped(ms: list[Manifest]) -> None:
    ms[:] = [
        m for m in ms if not (m.doc["kind"] == "NetworkPolicy" and m.doc["metadata"]["name"] == "durafix-worker-model")
    ]


def _no_default_deny(ms: list[Manifest]) -> None:
    ms[:] = [m for m in ms if m.doc["metadata"]["name"] != "durafix-default-deny"]


def _orchestration_opens_https(ms: list[Manifest]) -> None:
    egress = _policy(ms, "durafix-worker-orchestration")["spec"]["egress"]
    egress.append({"to": egress[-1]["to"], "ports": [{"protocol": "TCP", "port": 443}]})


def _metadata_service_reachable(ms: list[Manifest]) -> None:
    for rule in _policy(ms, "durafix-worker-environments")["spec"]["egress"]:
        for peer in rule.get("to", []):
            if "ipBlock" in peer and peer["ipBlock"]["cidr"] == "0.0.0.0/0":
                peer["ipBlock"]["except"].remove("169.254.0.0/16")


def _sandbox_reaches_another_pod(ms: list[Manifest]) -> None:
    egress = _policy(ms, "durafix-worker-environments")["spec"]["egress"]
    egress.append(
        {
            "to": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "durafix-receiver"}}}],
            "ports": [{"protocol": "TCP", "port": 8787}],
        }
    )


def _proxy_on_another_port(ms: list[Manifest]) -> None:
    for rule in _policy(ms, "durafix-worker-environments")["spec"]["egress"]:
        if any("podSelector" in peer for peer in rule["to"]):
            rule["ports"] = [{"protocol": "TCP", "port": 8080}]


def _egress_to_anything(ms: list[Manifest]) -> None:
    _policy(ms, "durafix-worker-forge")["spec"]["egress"].append({})


BREAKAGES: dict[str, tuple[Callable[[list[Manifest]], None], str]] = {
    "policy dropped": (_policy_dropped, "durafix-worker-model is selected by no NetworkPolicy of its own"),
    "no default deny": (_no_default_deny, "no default-deny NetworkPolicy"),
    "orchestration opens https": (_orchestration_opens_https, "opens egress ports [443, 7233], expected [7233]"),
    "metadata service reachable": (_metadata_service_reachable, "does not except ['169.254.0.0/16']"),
    "sandbox reaches another pod": (_sandbox_reaches_another_pod, "egress to the pods"),
    "proxy on another port": (_proxy_on_another_port, "the egress proxy on [8080]"),
    "egress to anything": (_egress_to_anything, "an egress rule without destinations or ports opens everything"),
    "misspelt field": (_misspelt_field, "Additional properties are not allowed ('resource' was unexpected)"),
    "unknown secret key": (_unknown_secret_key, "Secret 'durafix-model' defines no key 'apikey'"),
    "unknown config map": (_unknown_config_map, "no ConfigMap 'durafix-settings' is defined"),
    "unknown setting": (_unknown_setting, "DURAFIX_TEMPORAL_ADRESS is no durafix setting"),
    "unknown queue": (_unknown_queue, "--queues forges: unknown queue 'forges'"),
    "autoscaler of nothing": (_autoscaler_of_nothing, "scales Deployment/durafix-model, which is not defined"),
    "autoscaler on another queue": (_autoscaler_on_another_queue, "which durafix-worker-model does not poll"),
    "temporal key not mounted": (_temporal_key_not_mounted, "reconciler does not mount /etc/durafix/temporal/api-key"),
    "app key elsewhere": (_app_key_elsewhere, "forge: container worker does not mount /etc/durafix/app/"),
}


@pytest.mark.parametrize("breakage", BREAKAGES)
def test_a_broken_manifest_fails(manifests: list[Manifest], breakage: str) -> None:
    broken = [Manifest(m.file, copy.deepcopy(m.doc)) for m in manifests]
    mutate, expected = BREAKAGES[breakage]
    mutate(broken)
    errors = [e for m in broken for e in schema_errors(m)] + reference_errors(broken) + file_errors(broken)
    errors += network_policy_errors(broken)
    assert errors and any(expected in error for error in errors), errors


def test_an_unlisted_or_example_manifest_fails(manifests: list[Manifest]) -> None:
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    resources = [r for r in kustomization["resources"] if r != "worker-model.yaml"]
    resources.append("examples/secrets.example.yaml")
    assert kustomization_errors({"resources": resources}, manifests) == [
        "kustomization.yaml applies examples/secrets.example.yaml, an example",
        "worker-model.yaml is not in kustomization.yaml",
    ]
