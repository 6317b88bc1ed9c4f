"""What the live controller learns about the cluster before its first cycle, and again on
becoming leader: the Kueue API version served, the priority mode (Kueue's PriorityBoost gate,
else the mode the leader recorded on the Lease), the owner kinds served (JobSets, RayJobs...)
and Kueue's quota-check strategy (docs/operations.md). The readers are in
`controller.live.discovery` and `controller.live.owners`; this keeps their results.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from controller.config import Settings
from controller.domain import KUEUE_GROUP, KueueApiVersion, PriorityMode, QuotaCheck
from controller.live.api import LEASES, ApiError, Resource, Transport
from controller.live.backoff import Backoff
from controller.live.discovery import (
    MODE_ANNOTATION,
    ModeChoice,
    choose_kueue_version,
    mode_from_annotation,
    read_priority_boost_gate,
    read_quota_check,
    resolve_mode,
    served_versions,
)
from controller.live.owners import served_owner_resources

log = logging.getLogger(__name__)


class Discovery:
    def __init__(self, reader: Transport, settings: Settings, dry_run: bool,
                 lease_annotations: Callable[[], Mapping[str, str] | None]) -> None:
        self.reader = reader
        self.settings = settings
        self.dry_run = dry_run
        # What this replica's leader elector last saw on the Lease (None: no elector).
        self._lease_annotations = lease_annotations
        self.kueue_version: KueueApiVersion | None = None
        self.mode: ModeChoice | None = None
        self.owner_resources: list[Resource] = []  # served kinds in OWNER_KINDS
        self.quota_check = QuotaCheck()

    def _persisted_mode(self) -> PriorityMode | None:
        """The mode the leader recorded on the Lease (None when there is none)."""
        observed = self._lease_annotations()
        if observed:
            return mode_from_annotation(observed.get(MODE_ANNOTATION))
        try:
            lease = self.reader.request(
                "GET", LEASES.item(self.settings.lease_name, self.settings.controller_namespace))
        except ApiError:
            return None
        ann = ((lease or {}).get("metadata") or {}).get("annotations") or {}
        return mode_from_annotation(ann.get(MODE_ANNOTATION))

    def detect_mode(self) -> ModeChoice:
        """The priority mode from Kueue's configuration; when that cannot be read (anything
        but 404), the mode recorded on the Lease, else the last known one; raises `ApiError`
        when there is neither."""
        configured = self.settings.priority_mode
        try:
            gate, where = read_priority_boost_gate(self.reader, self.settings.kueue_namespace)
        except ApiError as e:
            if configured is not PriorityMode.AUTO:
                return resolve_mode(configured, None, f"Kueue's configuration unreadable: {e}")
            persisted = self._persisted_mode()
            if persisted is not None:
                return ModeChoice(persisted, None, f"auto: Kueue's configuration unreadable "
                                  f"({e.status or e.reason}); mode {persisted.value} as "
                                  f"recorded on Lease {self.settings.lease_name}")
            if self.mode is not None:
                return ModeChoice(self.mode.mode, self.mode.gate,
                                  f"{self.mode.reason} (kept: Kueue's configuration "
                                  f"unreadable: {e.status or e.reason})")
            raise
        return resolve_mode(configured, gate, where)

    def discover(self, stop: threading.Event, deadline: float | None = None,
                 failed: Callable[[str], None] = lambda _why: None) -> None:
        """Kueue API version, priority mode, owner kinds, quota check; retries until the
        apiserver answers (or `stop`, or the monotonic `deadline`), telling `failed` why."""
        backoff = Backoff(initial=1.0, cap=30.0)
        while not stop.is_set():
            try:
                self.kueue_version = choose_kueue_version(
                    served_versions(self.reader, KUEUE_GROUP)
                )
                self.mode = self.detect_mode()
                self.owner_resources = served_owner_resources(self.reader)
                try:
                    self.quota_check = read_quota_check(self.reader,
                                                        self.settings.kueue_namespace)
                except ApiError as e:
                    log.warning("cannot read Kueue's resources configuration (%s): assuming "
                                "BlockUndeclared (GPU fractions only where covered)", e)
                break
            except Exception as e:
                delay = backoff.next()
                if deadline is not None and time.monotonic() + delay > deadline:
                    raise
                log.warning("start-up discovery failed (%s); retrying in %.1fs", e, delay)
                failed(f"discovery: {e}")
                stop.wait(delay)
        if self.mode is not None and self.kueue_version is not None:
            log.info(
                "Kueue API %s; priority mode %s (%s)%s",
                self.kueue_version.value, self.mode.mode.value, self.mode.reason,
                "; DRY RUN: nothing will be written" if self.dry_run else "",
            )

    def refresh_mode(self) -> None:
        """On becoming leader: one fresh look at Kueue's configuration (the Lease records
        the result); keeps the current mode when it cannot be read."""
        try:
            choice = self.detect_mode()
        except ApiError as e:
            log.warning("cannot re-read Kueue's configuration (%s); keeping mode %s", e,
                        self.mode.mode.value if self.mode else "?")
            return
        if self.mode is None or choice.mode is not self.mode.mode:
            log.warning("priority mode %s (%s)", choice.mode.value, choice.reason)
        self.mode = choice
