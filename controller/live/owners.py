"""Workload owners of other Kueue-integrated kinds (JobSet, RayJob, Kubeflow jobs, ...).

Users annotate those objects (`wdrf.x-k8s.io/urgent`, `approved`, the team label), so the
controller watches the Kueue-managed ones (label `kueue.x-k8s.io/queue-name`) of every kind in
`controller.domain.OWNER_KINDS` that the cluster serves, and reads them like batch/v1 Jobs.
"""

from __future__ import annotations

import logging

from controller.domain import OWNER_KINDS
from controller.live.api import ApiError, Resource, Transport
from controller.live.discovery import served_resources, served_versions

log = logging.getLogger(__name__)


def owner_resources() -> list[Resource]:
    """Every kind the controller may read owners of, at a placeholder version (RBAC, docs)."""
    out = []
    for key, plural in OWNER_KINDS.items():
        group, _, kind = key.partition("/")
        out.append(Resource(group, "", plural, kind))
    return out


def served_owner_resources(transport: Transport) -> list[Resource]:
    """The owner kinds this cluster serves, at the group's first (preferred) version. A group
    that cannot be read (403, 5xx) is skipped with a warning: its owners' annotations are then
    not read, which the plan cannot see, so say it."""
    out: list[Resource] = []
    served: dict[str, tuple[str, set[str]]] = {}  # group -> (version, its resources)
    for res in owner_resources():
        if res.group not in served:
            try:
                versions = served_versions(transport, res.group)
                version = versions[0] if versions else ""
                plurals = served_resources(transport, f"{res.group}/{version}") if version \
                    else set()
            except ApiError as e:
                log.warning("cannot discover API group %s (%s): class annotations on its "
                            "objects are not read", res.group, e)
                version, plurals = "", set()
            served[res.group] = (version, plurals)
        version, plurals = served[res.group]
        if res.plural in plurals:
            out.append(Resource(res.group, version, res.plural, res.kind))
    return out
