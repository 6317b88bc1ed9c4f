"""Decayed usage history kept in a ConfigMap, so it survives restarts and leader changes.

Only the leader saves, at most every `save_every` seconds (and once on shutdown), and only
when the content changed: with USAGE_HALF_LIFE = 0 nothing is ever written.

A stored history that does not parse strictly (not JSON, a timestamp without a time zone or in
the future, a negative or non-numeric usage) is dropped: the controller starts from current
usage, `invalid` says why (the runner reports it as an Event), and the next save replaces it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

from controller.accounting import UsageHistory
from controller.live.api import CONFIG_MAPS, JSON, ApiError, Transport

log = logging.getLogger(__name__)

DATA_KEY = "history.json"


class HistoryStore:
    def __init__(
        self,
        transport: Transport,
        namespace: str,
        name: str,
        save_every: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._transport = transport
        self.namespace = namespace
        self.name = name
        self._save_every = save_every
        self._clock = clock
        self._last_save: float | None = None
        self._last_text: str | None = None
        self.invalid = ""  # why the stored history was dropped at the last load ("" = it was not)

    def _path(self) -> str:
        return CONFIG_MAPS.item(self.name, self.namespace)

    def load(self, now: datetime | None = None) -> UsageHistory | None:
        """The stored history; None when there is none or it cannot be read (logged)."""
        self.invalid = ""
        try:
            cm: JSON = self._transport.request("GET", self._path())
        except ApiError as e:
            if e.status != 404:
                log.warning("cannot read usage history %s/%s: %s", self.namespace, self.name, e)
            return None
        text = (cm.get("data") or {}).get(DATA_KEY)
        if not isinstance(text, str):
            return None
        try:
            history = UsageHistory.from_json(text, now or datetime.now(UTC))
        except ValueError as e:
            log.warning("ignoring invalid usage history in %s/%s (starting from current "
                        "usage): %s", self.namespace, self.name, e)
            self.invalid = str(e)
            return None
        self._last_text = text
        return history

    def save(self, history: UsageHistory, force: bool = False) -> bool:
        """Write if due (or forced) and changed. True if written."""
        now = self._clock()
        if not force and self._last_save is not None and now - self._last_save < self._save_every:
            return False
        text = history.to_json()
        if text == self._last_text:
            return False
        body: JSON = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": self.name, "namespace": self.namespace,
                         "labels": {"app.kubernetes.io/name": "wdrf-controller"}},
            "data": {DATA_KEY: text},
        }
        try:
            try:
                current: JSON = self._transport.request("GET", self._path())
            except ApiError as e:
                if e.status != 404:
                    raise
                self._transport.request("POST", CONFIG_MAPS.collection(self.namespace), body=body)
            else:
                current["data"] = {**(current.get("data") or {}), DATA_KEY: text}
                self._transport.request("PUT", self._path(), body=current)
        except ApiError as e:
            log.warning("cannot save usage history %s/%s: %s", self.namespace, self.name, e)
            return False
        self._last_save = now
        self._last_text = text
        return True
