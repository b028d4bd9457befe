"""``--pod-template FILE``: a pod template read with bounds, and checked for what it may not
change, before anything is made from it.

YAML is read with limits that a pod template never reaches and that a hostile file
passes at once: at most `MAX_TEMPLATE_DEPTH` levels of nesting (a deeper file would
exhaust Python's recursion), at most `MAX_TEMPLATE_NODES` values and
`MAX_TEMPLATE_EXPANDED_BYTES` of text *as expanded*: an alias counts what it names each
time it is used, so 300 bytes of nested aliases (an "alias bomb") cannot become megabytes
of Job; an alias used inside the node it names (a template that refers to itself) is
refused. Each is counted while the file is composed, so a refusal comes after reading
little more than the limit. Dates stay text (as ``kubectl`` reads them), and only JSON's
types are kept: an object the API server cannot take is refused here, naming where it is.

The node's container is jupyter_dist's (`control.launchers.k8s_manifests`): a template's
one container is merged into it, but its ``command`` and ``args`` are refused. They would
run in the node's place, or in front of it with its credentials at hand (a debugging
``sh -c env`` printed every key into the pod's log), and dropping them silently would
hide from the user that their command never ran; the error says what to use instead. The
names and paths of the volumes that carry a node's credentials (`RESERVED_VOLUMES`,
`RESERVED_PATHS`) and of the container that hands them over (`KEYS_CONTAINER`) are
jupyter_dist's: no container of a template may mount them or take those names. Everything
else a template sets is merged (`control.launchers.k8s_merge`), or refused there by name.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import yaml
import yaml.composer
import yaml.constructor
import yaml.resolver

from jupyter_dist.common.small_files import read_bounded
from jupyter_dist.errors import SpecError

#: the largest pod template file read
MAX_TEMPLATE_BYTES = 256 * 1024
#: the deepest nesting read (a pod spec's deepest field is about 15 levels down)
MAX_TEMPLATE_DEPTH = 32
#: the most values (mappings, lists, scalars) a template may expand to, aliases counted
#: each time they are used
MAX_TEMPLATE_NODES = 50_000
#: the most text a template's scalars may expand to (the API server keeps no object
#: larger than about 1.5 MiB)
MAX_TEMPLATE_EXPANDED_BYTES = 1024 * 1024

#: the Secret of every node's credentials, as a volume: mounted by `KEYS_CONTAINER` alone
CREDENTIALS_VOLUME = "jupyter-dist-credentials"
#: the memory-backed emptyDir in which `KEYS_CONTAINER` leaves this pod's node's
#: credentials for the node process, which removes them at once
NODE_KEY_VOLUME = "jupyter-dist-node-key"
RESERVED_VOLUMES = (CREDENTIALS_VOLUME, NODE_KEY_VOLUME)
CREDENTIALS_PATH = "/var/run/jupyter-dist/credentials"
NODE_KEY_PATH = "/var/run/jupyter-dist/node-key"
RESERVED_PATHS = (CREDENTIALS_PATH, NODE_KEY_PATH)
#: the init container that copies this pod's node's credentials out of the Secret
KEYS_CONTAINER = "jupyter-dist-keys"

_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")


class TemplateLimit(ValueError):
    """A template past one of the bounds; the message names the bound."""


try:  # libyaml's parser where PyYAML has it: a deep file is refused in microseconds
    from yaml._yaml import CParser as _CParser
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    _CParser = None


def _init_parser(loader: Any, stream: str) -> None:
    if _CParser is not None:
        _CParser.__init__(loader, stream)
        yaml.composer.Composer.__init__(loader)
        yaml.constructor.SafeConstructor.__init__(loader)
        yaml.resolver.Resolver.__init__(loader)
    else:
        yaml.SafeLoader.__init__(loader, stream)


_Bases: tuple[type, ...] = (
    (yaml.composer.Composer, _CParser, yaml.constructor.SafeConstructor, yaml.resolver.Resolver)
    if _CParser is not None
    else (yaml.SafeLoader,)
)


class _BoundedLoader(*_Bases):  # type: ignore[misc]
    """PyYAML's safe loader (its composer and constructor over libyaml's parser) counting,
    as it composes, the depth, and the values and text the document expands to (an alias
    adds the size of what it names), and refusing an alias used inside the node it
    names."""

    yaml_implicit_resolvers: ClassVar[dict[Any, list[tuple[str, Any]]]] = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != _TIMESTAMP]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def __init__(self, stream: str) -> None:
        _init_parser(self, stream)
        self.depth = 0
        self.nodes = 0
        self.chars = 0
        self.open: list[str] = []  # the anchors of the nodes being composed
        self.sizes: dict[str, tuple[int, int]] = {}  # anchor -> (values, text) it expands to

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent):
            alias = str(event.anchor)
            if alias in self.open:
                raise TemplateLimit(
                    f"alias *{alias} (line {line}) is inside the node &{alias} names: a "
                    "template that refers to itself; expected a tree"
                )
            nodes, chars = self.sizes.get(alias, (0, 0))  # undefined: PyYAML says so
            self._add(nodes, chars, f"*{alias}", line)
            return super().compose_node(parent, index)
        self.depth += 1
        if self.depth > MAX_TEMPLATE_DEPTH:
            raise TemplateLimit(
                f"nested deeper than {MAX_TEMPLATE_DEPTH} levels (line {line}); expected a "
                "pod template (none nests that deep)"
            )
        anchor: str | None = getattr(event, "anchor", None)
        before = (self.nodes, self.chars)
        if anchor is not None:
            self.open.append(anchor)
        try:
            node = super().compose_node(parent, index)
        finally:
            self.depth -= 1
            if anchor is not None:
                self.open.pop()
        text = len(node.value) if isinstance(node, yaml.ScalarNode) else 0
        self._add(1, text, "", line)
        if anchor is not None:
            self.sizes[anchor] = (self.nodes - before[0], self.chars - before[1])
        return node

    def _add(self, nodes: int, chars: int, alias: str, line: int) -> None:
        self.nodes += nodes
        self.chars += chars
        where = f" (at {alias}, line {line}: an alias counts what it names each time)"
        if self.nodes > MAX_TEMPLATE_NODES:
            raise TemplateLimit(
                f"expands to more than {MAX_TEMPLATE_NODES} values{where if alias else ''}; "
                "expected a pod template"
            )
        if self.chars > MAX_TEMPLATE_EXPANDED_BYTES:
            raise TemplateLimit(
                f"expands to more than {MAX_TEMPLATE_EXPANDED_BYTES // 1024} KiB of text"
                f"{where if alias else ''}; expected a pod template"
            )


def load_bounded(text: str) -> Any:
    """One YAML (or JSON) document within the bounds, as JSON's types; `TemplateLimit`
    past a bound or for a value JSON has no type for, `yaml.YAMLError` when it is no YAML."""
    loader = _BoundedLoader(text)
    try:
        data = loader.get_single_data()
    except yaml.YAMLError as err:
        if "maximum nesting depth" in str(err):  # libyaml's own bound, met looking ahead
            raise TemplateLimit(
                f"nested deeper than {MAX_TEMPLATE_DEPTH} levels (line "
                f"{getattr(getattr(err, 'problem_mark', None), 'line', 0) + 1}); expected a "
                "pod template (none nests that deep)"
            ) from None
        raise
    finally:
        loader.dispose()
    _check_json(data, "")
    return data


def _check_json(value: Any, where: str) -> None:
    """``value`` is JSON: mappings with text keys, lists, text, numbers, true/false/null."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TemplateLimit(
                    f"{where or 'the top'}: key {key!r} is not text; expected text keys (quote it)"
                )
            _check_json(item, f"{where}.{key}" if where else key)
    elif isinstance(value, list):
        for n, item in enumerate(value):
            _check_json(item, f"{where}[{n}]")
    elif isinstance(value, float) and not math.isfinite(value):
        raise TemplateLimit(
            f"{where or 'the top'}: {value!r}; expected a finite number (or quote it)"
        )
    elif value is not None and not isinstance(value, str | int | float):
        raise TemplateLimit(
            f"{where or 'the top'}: a {type(value).__name__}; expected text, a number, "
            "true/false or null"
        )


def read_pod_template(path: str) -> dict[str, Any]:
    """``--pod-template FILE``: a Pod, a PodTemplateSpec (``metadata``/``spec``) or a bare
    pod spec, YAML or JSON, at most `MAX_TEMPLATE_BYTES`, within the bounds, and with
    nothing of what `check_template` refuses; returned as a PodTemplateSpec."""
    label = f"--pod-template {path!r}"
    raw = read_bounded(path, MAX_TEMPLATE_BYTES, label, "a pod template")  # the server's too
    if raw is None:
        raise SpecError(f"{label}: No such file or directory")
    try:
        data = load_bounded(raw.decode())
    except TemplateLimit as err:
        raise SpecError(f"--pod-template {path!r}: {err}") from None
    except (UnicodeDecodeError, yaml.YAMLError) as err:
        raise SpecError(f"--pod-template {path!r}: not YAML or JSON ({err})") from None
    if not isinstance(data, dict):
        raise SpecError(
            f"--pod-template {path!r}: expected a mapping (a Pod, a pod template or a pod "
            f"spec), got {type(data).__name__}"
        )
    if data.get("kind") not in (None, "Pod", "PodTemplate"):
        raise SpecError(
            f"--pod-template {path!r}: kind {data.get('kind')!r}; expected Pod or PodTemplate"
        )
    if data.get("kind") == "PodTemplate":
        data = data.get("template") or {}
    if not isinstance(data, dict):
        raise SpecError(f"--pod-template {path!r}: template: expected a mapping")
    if "spec" not in data and "metadata" not in data:
        data = {"spec": data}
    spec, metadata = data.get("spec") or {}, data.get("metadata") or {}
    if not isinstance(spec, dict) or not isinstance(metadata, dict):
        raise SpecError(f"--pod-template {path!r}: spec and metadata must be mappings")
    containers = spec.get("containers", [])
    if not isinstance(containers, list) or len(containers) > 1:
        raise SpecError(
            f"--pod-template {path!r}: {len(containers) if isinstance(containers, list) else '?'}"
            " containers; expected at most one (its fields are merged into the node's "
            "container; add sidecars as initContainers with restartPolicy Always)"
        )
    try:
        check_template(spec)
    except TemplateLimit as err:
        raise SpecError(f"--pod-template {path!r}: {err}") from None
    return {"metadata": metadata, "spec": spec}


def check_template(spec: dict[str, Any]) -> None:
    """What a template's pod spec may not set (see the module's docstring); `TemplateLimit`
    naming the field."""
    node = (spec.get("containers") or [None])[0]
    if isinstance(node, dict):
        for field in ("command", "args"):
            if field in node:
                raise TemplateLimit(
                    f"spec.containers[0].{field}: the node's container runs jupyter_dist's "
                    "dial-back node, with its own command and args; a template's would run in "
                    "its place or in front of it. Remove it: run set-up in an initContainer "
                    "(restartPolicy Always for one that keeps running beside the node), and "
                    "give the node's container env, volumes and resources"
                )
    for volume in spec.get("volumes") or []:
        if isinstance(volume, dict) and volume.get("name") in RESERVED_VOLUMES:
            raise TemplateLimit(
                f"spec.volumes: {volume['name']!r} is jupyter_dist's (it carries the nodes' "
                "credentials); expected another name"
            )
    for kind in _CONTAINER_LISTS:
        for n, container in enumerate(spec.get(kind) or []):
            if not isinstance(container, dict):
                raise TemplateLimit(f"spec.{kind}[{n}]: expected a mapping")
            where = f"spec.{kind}[{n}]"
            if container.get("name") == KEYS_CONTAINER:
                raise TemplateLimit(
                    f"{where}.name {KEYS_CONTAINER!r} is jupyter_dist's; expected another name"
                )
            for mount in container.get("volumeMounts") or []:
                _check_mount(mount, f"{where}.volumeMounts")


def _check_mount(mount: Any, where: str) -> None:
    if not isinstance(mount, dict):
        raise TemplateLimit(f"{where}: expected mappings")
    if mount.get("name") in RESERVED_VOLUMES:
        raise TemplateLimit(
            f"{where}: volume {mount['name']!r} holds the nodes' credentials, which only "
            "jupyter_dist's own container mounts; expected another volume"
        )
    path = str(mount.get("mountPath") or "").rstrip("/")
    for reserved in RESERVED_PATHS:
        if path == reserved or path.startswith(reserved + "/"):
            raise TemplateLimit(
                f"{where}: mountPath {mount.get('mountPath')!r} is in {reserved}, where "
                "jupyter_dist hands a node its credentials; expected another path"
            )


__all__ = [
    "CREDENTIALS_PATH",
    "CREDENTIALS_VOLUME",
    "KEYS_CONTAINER",
    "MAX_TEMPLATE_BYTES",
    "MAX_TEMPLATE_DEPTH",
    "MAX_TEMPLATE_EXPANDED_BYTES",
    "MAX_TEMPLATE_NODES",
    "NODE_KEY_PATH",
    "NODE_KEY_VOLUME",
    "RESERVED_PATHS",
    "RESERVED_VOLUMES",
    "TemplateLimit",
    "check_template",
    "load_bounded",
    "read_pod_template",
]
