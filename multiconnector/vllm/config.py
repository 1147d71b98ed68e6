"""The children of a configuration: their names, their own transfer configs and classes.

A child is what vLLM's own ``MultiConnector`` reads: one ``KVTransferConfig`` as a mapping in
``kv_connector_extra_config["connectors"]``. Its name is optional:

* without one, a child is named after its ``kv_connector``; the second child of one class is
  ``<kv_connector>#2``, the third ``<kv_connector>#3``, and so on (counted over every child of
  that class, named or not, in configuration order);
* an explicit name goes *inside* the child's ``kv_connector_extra_config``, under
  :data:`NAME_KEY`: vLLM's own config checks build each child as ``KVTransferConfig(**child)``,
  which refuses an unknown top-level key. The key is removed from the config the child is built
  with.

Every child is checked before any is built, so a bad configuration starts nothing.
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, final

import attrs
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

from .._validate import bad_argument, check_int, check_name, check_seconds, shown
from ..errors import DuplicateConnectorError, InvalidArgumentError, InvalidValueError
from ..healthbook import HealthSettings
from ..lookup import Lookup, lookup_of
from ..registry import Role
from ..rule import FAILURE_KINDS
from .errors import ChildClassError

__all__ = [
    "CHILDREN_KEY",
    "FALLBACKS",
    "FALLBACK_KEY",
    "HEALTH_KEY",
    "HIT_METRICS_KEY",
    "LOOKUP_KEY",
    "NAME_KEY",
    "OVERDUE_KEY",
    "OVERDUE_SECONDS",
    "PATIENCE_KEY",
    "PATIENCE_STEPS",
    "ROLE_KEY",
    "SPLIT_KEY",
    "ChildSpec",
    "Settings",
    "child_specs",
    "default_name",
    "fails_over",
    "health_settings",
    "hit_metrics",
    "kv_role_disagreement",
    "lookup_policy",
    "overdue_seconds",
    "patience_steps",
    "settings_of",
    "split_loads",
]

#: The ``kv_connector_extra_config`` key listing the children (the key vLLM's own uses too).
CHILDREN_KEY: Final = "connectors"

#: The key, in a child's own ``kv_connector_extra_config``, of its explicit name.
NAME_KEY: Final = "multiconnector_name"

#: The key, in a child's own ``kv_connector_extra_config``, of its role: ``"save"`` (never
#: looked up, never told to load), ``"load"`` (never awaited for a save) or ``"both"``, the
#: default (:class:`multiconnector.Role`).
ROLE_KEY: Final = "multiconnector_role"

#: The keys of a child's own extra config that are ours, removed before the child is built.
OUR_KEYS: Final = frozenset({NAME_KEY, ROLE_KEY})

#: The ``kv_connector_extra_config`` key (beside ``connectors``) of how long a child may owe a
#: save's or a load's report before it is counted and warned about as overdue.
OVERDUE_KEY: Final = "report_overdue_seconds"
#: Its default: above the longest wait vLLM's own connectors allow a transfer by default
#: (MooncakeConnector's abort timeout, 480 s; NixlConnector's lease is 30 s, renewed while the
#: decode side lives), so a healthy prefill waiting for its decode is not warned about.
OVERDUE_SECONDS: Final = 600.0

#: The ``kv_connector_extra_config`` key of the lookup policy: ``"first"`` (vLLM's rule, the
#: default) or ``"longest"`` (:class:`multiconnector.Lookup`).
LOOKUP_KEY: Final = "lookup"
#: The key of whether a request's load may be split across the children that load token ranges
#: (``update_state_after_alloc_range``): after the lookup policy chose the loader, the tokens
#: past its hit are looked up in the others. ``False`` by default.
SPLIT_KEY: Final = "split_loads"
#: The key of whether each child's lookup counts go into vLLM's stats and Prometheus metrics
#: (a bool, false by default: vLLM's class reports none).
HIT_METRICS_KEY: Final = "child_hit_metrics"

#: The key of how many times in a row, under ``"longest"``, a child may answer a request's
#: lookup ``None`` ("ask me again") before the lookup goes on without it (counted and logged).
PATIENCE_KEY: Final = "lookup_patience_steps"
#: Its default: vLLM asks again each scheduler step.
PATIENCE_STEPS: Final = 64
#: The key of what becomes of a load whose loader raises in ``update_state_after_alloc``:
#: ``"recompute"`` (the default: reported failed, vLLM recomputes) or ``"failover"`` (the next
#: child that offers the tokens loads them; reported failed only when none does).
FALLBACK_KEY: Final = "load_fallback"
#: Its values.
FALLBACKS: Final = ("recompute", "failover")


#: The key of each child's health machine (:mod:`multiconnector.health`): a mapping of its
#: bounds (``{}``: every default), or absent (or ``None``): off, as before it existed.
HEALTH_KEY: Final = "health"
#: Each key of the health mapping and its kind: a count (>= 1), seconds (> 0), a bound
#: (seconds > 0, or ``None``: off), a rate (``0 < x <= 1``, or ``None``: off), or kinds of
#: failure (:data:`~multiconnector.rule.FAILURE_KINDS` listed).
_HEALTH_FIELDS: Final = {
    "threshold": "count",
    "failure_rate": "rate",
    "min_calls": "count",
    "window_seconds": "seconds",
    "cooldown_seconds": "seconds",
    "max_cooldown_seconds": "seconds",
    "probes": "count",
    "slow_lookup_seconds": "bound",
    "count": "kinds",
}


@final
@dataclass(frozen=True)
class ChildSpec:
    """One configured child: its unique name and its own transfer config.

    .. versionadded:: 0.1.0
    """

    name: str
    config: Any  # vllm.config.KVTransferConfig
    role: Role = Role.both

    @property
    def kv_connector(self) -> str:
        return str(self.config.kv_connector)

    @property
    def module_path(self) -> str | None:
        path = self.config.kv_connector_module_path
        return None if path is None else str(path)

    def connector_class(self) -> type[Any]:
        """The child's connector class, found the way vLLM's factory finds it; a
        :class:`~multiconnector.vllm.errors.ChildClassError` naming the child if it cannot be."""
        try:
            return KVConnectorFactory.get_connector_class(self.config)  # type: ignore[no-any-return]
        except (ValueError, ImportError, AttributeError) as exc:
            raise ChildClassError(self.name, self.kv_connector, self.module_path, exc) from exc

    def stats_source(self) -> tuple[str, str | None]:
        """The class that rebuilds this child's stats from a payload, as ``(name, module
        path)`` for :func:`connector_class`: the class vLLM's factory builds for the child, by
        the name vLLM's registry knows it under (vLLM 0.34 builds ``NixlConnector`` as
        ``NixlPullConnector`` or ``NixlPushConnector`` by its ``transfer_mode``); the configured
        name when the registry knows the class under no other."""
        if self.module_path:
            return self.kv_connector, self.module_path
        built = self.connector_class()
        try:
            if KVConnectorFactory.get_connector_class_by_name(built.__name__) is built:
                return built.__name__, None
        except ValueError:  # registered under the configured name only
            pass
        return self.kv_connector, None

    def supports_hma(self) -> bool:
        """Whether the child's class implements ``SupportsHMA`` (vLLM's own test)."""
        self.connector_class()  # a class that cannot be loaded: named here, with the child
        return bool(KVConnectorFactory.supports_hma_config(self.config))

    def vllm_config(self, vllm_config: Any) -> Any:
        """A shallow copy of ``vllm_config`` carrying this child's transfer config."""
        child_config = copy.copy(vllm_config)
        child_config.kv_transfer_config = self.config
        return child_config


def default_name(kv_connector: str, occurrence: int) -> str:
    """The name of the ``occurrence``-th (from 1) child of class ``kv_connector``.

    >>> default_name("NixlConnector", 1), default_name("NixlConnector", 2)
    ('NixlConnector', 'NixlConnector#2')

    .. versionadded:: 0.1.0
    """
    return kv_connector if occurrence == 1 else f"{kv_connector}#{occurrence}"


def child_specs(
    extra_config: Mapping[str, Any], *, engine_id: str | None = None
) -> tuple[ChildSpec, ...]:
    """Read and check the children listed in ``kv_connector_extra_config``.

    ``engine_id`` is the default for children that set none (the parent's, as vLLM's own
    ``MultiConnector`` does). Each child must be a valid ``KVTransferConfig`` (so it names its
    ``kv_role``, which vLLM's own checks require too).

    >>> [s.name for s in child_specs({"connectors": [
    ...     {"kv_connector": "ExampleConnector", "kv_role": "kv_both"},
    ...     {"kv_connector": "ExampleConnector", "kv_role": "kv_both"},
    ...     {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
    ...      "kv_connector_extra_config": {"multiconnector_name": "disk"}}]})]
    ['ExampleConnector', 'ExampleConnector#2', 'disk']

    .. versionadded:: 0.1.0
    """
    if not isinstance(extra_config, Mapping):
        raise InvalidArgumentError(
            f"kv_connector_extra_config={shown(extra_config)} must be a mapping"
        )
    listed = extra_config.get(CHILDREN_KEY)
    if not isinstance(listed, list | tuple) or not listed:
        raise bad_argument(isinstance(listed, list | tuple))(
            f"kv_connector_extra_config[{CHILDREN_KEY!r}]={shown(listed)} must be a non-empty "
            "list of child connector configs"
        )
    specs: list[ChildSpec] = []
    where_named: dict[str, str] = {}
    occurrences: dict[str, int] = {}
    for index, item in enumerate(listed):
        where = f"kv_connector_extra_config[{CHILDREN_KEY!r}][{index}]"
        if not isinstance(item, Mapping):
            raise InvalidArgumentError(f"{where}={shown(item)} must be a mapping")
        if "name" in item:
            raise InvalidValueError(
                f"{where}['name']={item['name']!r}: a child's name goes in its own "
                f"kv_connector_extra_config[{NAME_KEY!r}] (vLLM's config checks build each "
                "child as a KVTransferConfig, which has no 'name' field)"
            )
        fields = dict(item)
        connector = fields.get("kv_connector")
        if not isinstance(connector, str) or not connector:
            raise bad_argument(isinstance(connector, str))(
                f"{where}['kv_connector']={shown(connector)} must be a connector class name"
            )
        occurrences[connector] = occurrences.get(connector, 0) + 1
        own_extra = fields.get("kv_connector_extra_config")
        if own_extra is not None and not isinstance(own_extra, Mapping):
            raise InvalidArgumentError(
                f"{where}['kv_connector_extra_config']={shown(own_extra)} must be a mapping"
            )
        role = _role(own_extra, f"{where}['kv_connector_extra_config'][{ROLE_KEY!r}]")
        if own_extra is not None and OUR_KEYS.intersection(own_extra):
            fields["kv_connector_extra_config"] = {
                key: value for key, value in own_extra.items() if key not in OUR_KEYS
            }
        if own_extra is not None and NAME_KEY in own_extra:
            name_where = f"{where}['kv_connector_extra_config'][{NAME_KEY!r}]"
            name = check_name(own_extra[NAME_KEY], name_where)
        else:
            name_where = f"{where} (named after its kv_connector)"
            name = default_name(connector, occurrences[connector])
        if name in where_named:
            raise DuplicateConnectorError(
                f"{name_where}: name {name!r} is already taken by {where_named[name]}; "
                f"names must be unique (set kv_connector_extra_config[{NAME_KEY!r}])"
            )
        where_named[name] = where
        if fields.get("engine_id") is None and engine_id is not None:
            fields["engine_id"] = engine_id
        try:
            config = KVTransferConfig(**fields)
        except (TypeError, ValueError) as exc:
            raise bad_argument(isinstance(exc, ValueError))(
                f"{where} (name={name!r}) is not a valid KVTransferConfig: {exc}"
            ) from exc
        specs.append(ChildSpec(name, config, _agreeing(role, config.kv_role, where, name)))
    return tuple(specs)


#: The child ``kv_role`` each ``multiconnector_role`` contradicts: a save-only child (never
#: asked to load) that only consumes KV, a load-only child (never awaited for a save) that only
#: produces it. ``kv_both`` agrees with every role.
_CONTRADICTED_BY: Final = {Role.save: "kv_consumer", Role.load: "kv_producer"}


def _agreeing(role: Role, kv_role: Any, where: str, name: str) -> Role:
    """``role``, checked: a child's ``multiconnector_role`` must not contradict its own
    ``kv_role``. vLLM reads the children's ``kv_role`` (0.34: whether the engine produces or
    consumes KV, for a ``MultiConnector``; every version: what the child itself does, NIXL's
    side of a transfer), and ours holds the child to its ``multiconnector_role``. The two
    disagreeing, one of them is wrong; neither is guessed."""
    if _CONTRADICTED_BY.get(role) != kv_role:
        return role
    does = "never loads" if role is Role.save else "is never awaited for a save"
    only = "only loads (consumes) KV" if role is Role.save else "only saves (produces) KV"
    raise InvalidValueError(
        f"{where}['kv_connector_extra_config'][{ROLE_KEY!r}]={role.value!r} contradicts "
        f"{where}['kv_role']={kv_role!r} (name={name!r}): a {role.value}-only child {does}, "
        f"and kv_role={kv_role!r} says it {only}; set kv_role='kv_both' or change one of them"
    )


#: Whether a ``kv_role`` produces KV (saves) and whether it consumes it (loads).
_DOES: Final[dict[Any, tuple[bool, bool]]] = {
    "kv_producer": (True, False),
    "kv_consumer": (False, True),
    "kv_both": (True, True),
}
_KV_ROLE_OF: Final = {does: kv_role for kv_role, does in _DOES.items()}
_NEITHER: Final = (False, False)


def kv_role_disagreement(kv_role: Any, specs: tuple[ChildSpec, ...]) -> str | None:
    """What is wrong when the top-level ``kv_role`` disagrees with the children's (``None``
    when it agrees): whether the engine produces and consumes KV, by the top-level one, is not
    what the children's say together. vLLM 0.34 reads only the children's for a
    ``MultiConnector`` (``KVTransferConfig.is_kv_producer``, ``is_kv_consumer``: offloading a
    finished request's partial tail, deferring block frees under overlapping batches, ...);
    0.33 reads only the top-level one. Each child still does what its own says."""
    says = _DOES.get(kv_role)
    if says is None or not specs:
        return None
    roles = {spec.name: spec.config.kv_role for spec in specs}
    each = [_DOES.get(role, _NEITHER) for role in roles.values()]
    union = (any(does[0] for does in each), any(does[1] for does in each))
    if says == union:
        return None
    verbs = ("produces", "consumes")
    wrong = [
        f"child {name!r} ({role}) {verbs[i]} KV, which {kv_role} says this engine does not"
        for name, role in roles.items()
        for i in (0, 1)
        if _DOES.get(role, _NEITHER)[i] and not says[i]
    ]
    lacking = [
        f"no child {verbs[i]} KV, which {kv_role} says this engine does"
        for i in (0, 1)
        if says[i] and not union[i]
    ]
    reads = (
        "the children's kv_role"
        if hasattr(KVTransferConfig, "_connector_roles")
        else "the top-level kv_role"
    )
    return (
        f"kv_transfer_config.kv_role={kv_role!r} disagrees with the children's kv_role: "
        f"{'; '.join(wrong + lacking)} (children: "
        f"{', '.join(f'{name}={role}' for name, role in roles.items())}). This vLLM reads "
        f"{reads} to decide whether the engine produces and consumes KV (vLLM 0.34 the "
        "children's, 0.33 the top-level one); each child still does what its own says. Set "
        f"kv_role={_KV_ROLE_OF.get(union, 'kv_both')!r}, what the children say together"
    )


def _role(own_extra: Mapping[str, Any] | None, where: str) -> Role:
    """The role a child's own extra config gives it (:data:`ROLE_KEY`), checked."""
    if own_extra is None or ROLE_KEY not in own_extra:
        return Role.both
    value = own_extra[ROLE_KEY]
    names = ", ".join(repr(role.value) for role in Role)
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{where}={shown(value)} must be one of {names}")
    try:
        return Role(value)
    except ValueError:
        raise InvalidValueError(f"{where}={value!r} must be one of {names}") from None


def overdue_seconds(extra_config: Mapping[str, Any]) -> float:
    """``kv_connector_extra_config[OVERDUE_KEY]``, checked (a number of seconds > 0), or
    :data:`OVERDUE_SECONDS`."""
    value = extra_config.get(OVERDUE_KEY, OVERDUE_SECONDS)
    return check_seconds(value, f"kv_connector_extra_config[{OVERDUE_KEY!r}]", positive=True)


def lookup_policy(extra_config: Mapping[str, Any]) -> Lookup:
    """``kv_connector_extra_config[LOOKUP_KEY]``, checked, or :attr:`Lookup.first`."""
    return lookup_of(
        extra_config.get(LOOKUP_KEY, "first"), f"kv_connector_extra_config[{LOOKUP_KEY!r}]"
    )


def hit_metrics(extra_config: Mapping[str, Any]) -> bool:
    """``kv_connector_extra_config[HIT_METRICS_KEY]``, checked (a bool), or ``False``."""
    value = extra_config.get(HIT_METRICS_KEY, False)
    if not isinstance(value, bool):
        raise InvalidArgumentError(
            f"kv_connector_extra_config[{HIT_METRICS_KEY!r}]={shown(value)} must be a bool"
        )
    return value


def split_loads(extra_config: Mapping[str, Any]) -> bool:
    """``kv_connector_extra_config[SPLIT_KEY]``, checked (a bool), or ``False``."""
    value = extra_config.get(SPLIT_KEY, False)
    if not isinstance(value, bool):
        raise InvalidArgumentError(
            f"kv_connector_extra_config[{SPLIT_KEY!r}]={shown(value)} must be a bool"
        )
    return value


def fails_over(extra_config: Mapping[str, Any]) -> bool:
    """Whether ``kv_connector_extra_config[FALLBACK_KEY]``, checked, is ``"failover"``
    (absent: ``"recompute"``)."""
    value = extra_config.get(FALLBACK_KEY, FALLBACKS[0])
    where = f"kv_connector_extra_config[{FALLBACK_KEY!r}]"
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{where}={shown(value)} must be a str: one of {FALLBACKS}")
    if value not in FALLBACKS:
        raise InvalidValueError(f"{where}={value!r} must be one of {FALLBACKS}")
    return value == "failover"


def patience_steps(extra_config: Mapping[str, Any]) -> int:
    """``kv_connector_extra_config[PATIENCE_KEY]``, checked (an int >= 1), or
    :data:`PATIENCE_STEPS`."""
    value = extra_config.get(PATIENCE_KEY, PATIENCE_STEPS)
    return check_int(value, f"kv_connector_extra_config[{PATIENCE_KEY!r}]", minimum=1)


def health_settings(extra_config: Mapping[str, Any]) -> HealthSettings | None:
    """``kv_connector_extra_config[HEALTH_KEY]``, checked (each key named with its full path),
    or ``None`` (off) when absent or ``None``: an unknown key is refused (a misspelt bound
    would otherwise be its default, silently), ``max_cooldown_seconds`` may not be below
    ``cooldown_seconds``, and one trip rule is given: ``threshold`` (a count) or
    ``failure_rate`` (a share, with ``min_calls``), not both."""
    value = extra_config.get(HEALTH_KEY)
    if value is None:
        return None
    where = f"kv_connector_extra_config[{HEALTH_KEY!r}]"
    if not isinstance(value, Mapping):
        raise InvalidArgumentError(
            f"{where}={shown(value)} must be a mapping of the health bounds "
            f"({', '.join(_HEALTH_FIELDS)}), or absent for no health machine"
        )
    unknown = sorted(str(key) for key in value if key not in _HEALTH_FIELDS)
    if unknown:
        raise InvalidValueError(
            f"{where} has unknown key(s) {unknown}; the keys are {list(_HEALTH_FIELDS)}"
        )
    fields: dict[str, Any] = {}
    for key, kind in _HEALTH_FIELDS.items():
        if key not in value:
            continue
        at = f"{where}[{key!r}]"
        if kind == "count":
            fields[key] = check_int(value[key], at, minimum=1)
        elif kind == "kinds":
            fields[key] = failure_kinds(value[key], at)
        elif kind == "rate":
            fields[key] = None if value[key] is None else failure_rate(value[key], at)
        elif kind == "seconds" or value[key] is not None:
            fields[key] = check_seconds(value[key], at, positive=True)
    one_trip_rule(value, fields.get("failure_rate"), where)
    settings = HealthSettings(**fields)
    if settings.max_cooldown_seconds < settings.cooldown_seconds:
        raise InvalidValueError(
            f"{where}['max_cooldown_seconds']={settings.max_cooldown_seconds:g} must be >= "
            f"{where}['cooldown_seconds']={settings.cooldown_seconds:g}"
        )
    return settings


def failure_rate(value: Any, where: str) -> float:
    """``health.failure_rate``, checked: a number, ``0 < x <= 1`` (the share of a window's
    calls failed that opens a child); ``where`` names the key in each error."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise InvalidArgumentError(
            f"{where}={shown(value)} must be a number (the share of calls failed, "
            "0 < x <= 1), or null for off"
        )
    if not 0 < value <= 1:  # (NaN too)
        raise InvalidValueError(f"{where}={shown(value)} must be > 0 and <= 1")
    return float(value)


def one_trip_rule(value: Mapping[str, Any], rate: float | None, where: str) -> None:
    """One trip rule per composition: ``threshold`` (a count) or ``failure_rate`` (a share),
    not both given; ``min_calls`` only with ``failure_rate``. ``value``: the health mapping
    given; ``rate``: its ``failure_rate`` checked (``None``: not given, or ``null``)."""
    if rate is not None and "threshold" in value:
        raise InvalidValueError(
            f"{where}['threshold']={shown(value['threshold'])} and "
            f"{where}['failure_rate']={shown(value['failure_rate'])} are two trip rules, a "
            "count of failures and a share of calls: give one"
        )
    if rate is None and "min_calls" in value:
        raise InvalidValueError(
            f"{where}['min_calls']={shown(value['min_calls'])} is read only with "
            f"{where}['failure_rate'] (the rate rule): give failure_rate, or drop min_calls"
        )


def failure_kinds(value: Any, where: str) -> frozenset[str]:
    """``health.count``, checked: a non-empty list or tuple of kinds of failure
    (:data:`~multiconnector.rule.FAILURE_KINDS`); ``where`` names the key in each error."""
    if not isinstance(value, list | tuple) or not all(isinstance(k, str) for k in value):
        raise InvalidArgumentError(
            f"{where}={shown(value)} must be a list of kinds of failure, of {list(FAILURE_KINDS)}"
        )
    unknown = sorted(set(value) - set(FAILURE_KINDS))
    if unknown or not value:
        raise InvalidValueError(
            f"{where}={shown(value)} must name one or more kinds of failure, of "
            f"{list(FAILURE_KINDS)}" + (f" (unknown: {unknown})" if unknown else "")
        )
    return frozenset(value)


@attrs.frozen(kw_only=True)
class Settings:
    """The composition's own settings in ``kv_connector_extra_config``, each checked before
    any child starts: :func:`settings_of`."""

    #: How long a child may owe a save's or a load's report before it is counted and warned
    #: about.
    overdue: float
    #: Which child's hit loads a request.
    lookup: Lookup
    #: Under ``longest``, how many ``None`` answers in a row a child may give a request.
    patience: int
    #: Whether the lookups per child go into vLLM's stats payload and Prometheus.
    hit_metrics: bool
    #: Whether a load may be split across the children that load token ranges.
    split: bool = False
    #: Each child's health machine's bounds (``None``: no health machine).
    health: HealthSettings | None = None
    #: Whether a loader that raises at allocation hands its load to the next child that
    #: offers the tokens (``load_fallback: failover``).
    failover: bool = False


def settings_of(extra_config: Mapping[str, Any]) -> Settings:
    """The composition's :class:`Settings`, each checked (its own error names its key)."""
    return Settings(
        overdue=overdue_seconds(extra_config),
        lookup=lookup_policy(extra_config),
        patience=patience_steps(extra_config),
        hit_metrics=hit_metrics(extra_config),
        split=split_loads(extra_config),
        health=health_settings(extra_config),
        failover=fails_over(extra_config),
    )


def specs_of(kv_transfer_config: Any) -> tuple[ChildSpec, ...]:
    """The children of a parent ``KVTransferConfig``."""
    return child_specs(
        kv_transfer_config.kv_connector_extra_config, engine_id=kv_transfer_config.engine_id
    )


def without_hma(specs: tuple[ChildSpec, ...]) -> list[str]:
    """The names of the children whose class does not implement ``SupportsHMA``."""
    return [spec.name for spec in specs if not spec.supports_hma()]


def connector_class(kv_connector: str, module_path: str | None) -> type[Any]:
    """A connector class by name: from ``module_path`` if given, else vLLM's registry."""
    if module_path:
        return getattr(importlib.import_module(module_path), kv_connector)  # type: ignore[no-any-return]
    return KVConnectorFactory.get_connector_class_by_name(kv_connector)  # type: ignore[no-any-return]
