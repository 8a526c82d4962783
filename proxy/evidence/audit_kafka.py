"""``audit.topic``: the audit events as records of a Kafka topic, for a fleet's evidence in one
place (the report reads the topic as it reads files).

Each record's value is one schema v2 event as JSON (no newline); its key is the proxy's
instance id (``audit.instance_id``, default the hostname), so one instance's events stay in
one partition, in order. The producer is confluent-kafka (librdkafka), idempotent, compressed
and batched (``AUDIT_PRODUCER_DEFAULTS`` in proxy/config/model.py, over which ``audit.producer``
goes). It connects to ``audit.bootstrap_servers`` (default the upstream's) directly, never
through the proxy's listeners: no policy of the proxy sees it and no connection count
includes it.

It never holds up the data path: the event loop only appends to the sink's bounded queue
(proxy/evidence/audit.py); this output runs in that queue's writer thread, ``produce`` never blocks,
and librdkafka's buffer is bounded (``queue.buffering.max.kbytes``, ``message.timeout.ms``).
When the brokers are slow or down, the buffer fills: events are dropped and counted
(``kafka_admission_audit_events_dropped_total{sink="topic"}``), the writer backs off (whole
batches dropped without trying, for a time that doubles up to ``_BACKOFF_MAX_S``), and what
goes wrong is logged at a limited rate. When they come back, events flow again.

The topic is created at start if missing (``topic_partitions``, ``topic_replication_factor``,
``topic_config``; a week's retention by default), by its own thread, retried with backoff,
and again when a delivery says the topic is gone.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from proxy.config.model import Audit, Upstream
from proxy.evidence.logs import RateLimitedLog
from proxy.evidence.metrics import Metrics

_log = logging.getLogger("kafka_admission_proxy.audit.topic")
_LOG_INTERVAL_S = 60.0
_BUSY_POLL_S = 0.1  # while records are in flight: delivery reports are served this often
_IDLE_POLL_S = 1.0
_BACKOFF_MIN_S = 0.1  # after a full producer buffer, batches are dropped (counted) this long ...
_BACKOFF_MAX_S = 5.0  # ... doubling up to this while it stays full
_FLUSH_AT_STOP_S = 4.0  # under proxy/evidence/audit.py's CLOSE_TIMEOUT_S
_TOPIC_RETRY_MIN_S = 1.0
_TOPIC_RETRY_MAX_S = 60.0
_ADMIN_TIMEOUT_S = 10.0
_WEDGED_MARGIN_S = 5.0


class _LibrdkafkaLog:
    """librdkafka's own log lines (served by ``poll``), into ours at a limited rate: a down
    broker makes one "Connect failed" line per reconnect."""

    def __init__(self, limited: RateLimitedLog) -> None:
        self._limited = limited

    def log(self, level: int, msg: str, *args: Any) -> None:
        facility = args[0] if args else ""
        self._limited.log(level, ("librdkafka", facility), time.monotonic(), "audit topic: librdkafka: " + msg, *args)


class TopicOutput:
    """The ``topic`` sink's output, driven by its writer thread (proxy/evidence/audit.py ``_Writer``)."""

    counts_delivery = True

    def __init__(self, settings: Audit, upstream: Upstream, metrics: Metrics) -> None:
        assert settings.topic is not None
        self.topic = settings.topic
        self._settings = settings
        self._upstream = upstream
        self._key = settings.instance.encode()
        self._limited = RateLimitedLog(_log, _LOG_INTERVAL_S)
        self._config: dict[str, Any] = {
            **settings.producer_config(upstream),
            "logger": _LibrdkafkaLog(self._limited),
            "error_cb": self._error,
        }
        self._written = metrics.audit_events
        self._dropped = metrics.audit_events_dropped.labels("topic")
        self._delivered: dict[str, Callable[[KafkaError | None, Message], None]] = {}
        self._producer: Producer | None = None
        self._broken: str | None = None  # why the producer must be replaced (tick() does it)
        # librdkafka reports every record within message.timeout.ms: a producer with records
        # and no report for longer is wedged (an idempotent one facing a broker that lost its
        # producer state, after a restart, can be): it is replaced.
        timeout_ms = float(self._config.get("message.timeout.ms", 300000))  # 0: librdkafka waits for ever
        self._report_deadline_s = timeout_ms / 1000 + _WEDGED_MARGIN_S if timeout_ms > 0 else math.inf
        self._last_report = self._last_success = time.monotonic()
        self._backoff_until = 0.0
        self._backoff_s = 0.0
        self._full = 0  # events refused by a full buffer since the last line about it
        # The topic: created by its own thread, so the writer never waits on an admin request.
        self._admin_limited = RateLimitedLog(_log, _LOG_INTERVAL_S)  # that thread's own
        self._topic_wanted = threading.Event()
        self._stopping = threading.Event()
        self._topic_thread = threading.Thread(target=self._keep_topic, name="audit-topic-admin", daemon=True)

    # --- the writer thread -------------------------------------------------------------

    def start(self) -> None:
        self._producer = self._new_producer()
        self._topic_wanted.set()
        self._topic_thread.start()

    def write(self, lines: list[bytes], kinds: list[str]) -> int:
        producer = self._producer
        assert producer is not None
        now = time.monotonic()
        if now < self._backoff_until:
            self._full += len(lines)
            return 0
        produce, topic, key = producer.produce, self.topic, self._key
        if not len(producer):  # nothing outstanding: the clocks of the two checks in tick() start again
            self._last_report = self._last_success = now
        for taken, (line, kind) in enumerate(zip(lines, kinds, strict=True)):
            try:
                produce(topic, line[:-1], key, on_delivery=self._on_delivery(kind))
            except BufferError:  # librdkafka's queue is full: the brokers are slow or down
                self._back_off(now, len(lines) - taken)
                self._poll()
                return taken
            except KafkaException as exc:  # a fatal state: produce refuses everything
                self._broken = exc.args[0].str()
                return taken
        self._backoff_s = 0.0
        self._poll()
        return len(lines)

    def tick(self) -> None:
        assert self._producer is not None
        self._poll()
        if self._broken is None and len(self._producer):
            if time.monotonic() - self._last_report > self._report_deadline_s:
                self._broken = f"no delivery report for {self._report_deadline_s:g}s (message.timeout.ms + 5 s)"
        if self._broken is not None:
            self._replace_producer()

    def _poll(self) -> None:
        assert self._producer is not None
        try:
            self._producer.poll(0)
        except KafkaException as exc:  # a fatal error raised through poll
            self._broken = exc.args[0].str()

    def wait_seconds(self) -> float:
        return _BUSY_POLL_S if self._producer is not None and len(self._producer) else _IDLE_POLL_S

    def finish(self) -> None:
        self._stopping.set()
        self._topic_wanted.set()
        if self._producer is None:
            return
        left = self._producer.flush(_FLUSH_AT_STOP_S)
        if left:
            _log.warning(
                "audit topic %s: %d events not delivered within %gs at stop; dropped and counted",
                self.topic,
                left,
                _FLUSH_AT_STOP_S,
            )
            self._dropped.inc(left)
        self._producer = None

    def _new_producer(self) -> Producer:
        return Producer(self._config)

    def _on_delivery(self, kind: str) -> Callable[[KafkaError | None, Message], None]:
        callback = self._delivered.get(kind)
        if callback is None:
            written = self._written.labels(kind, "topic")

            def callback(err: KafkaError | None, msg: Message) -> None:
                self._last_report = time.monotonic()
                if err is None:
                    self._last_success = self._last_report
                    written.inc()
                else:
                    self._undelivered(err)

            self._delivered[kind] = callback
        return callback

    def _undelivered(self, err: KafkaError) -> None:
        self._dropped.inc()
        # Every record failing for two message timeouts: a broker that came back empty (lost the
        # idempotent producer's id) leaves librdkafka retrying forever; a new producer gets a new id.
        if self._broken is None and self._last_report - self._last_success > 2 * self._report_deadline_s:
            self._broken = f"no record delivered for {self._last_report - self._last_success:.0f}s"
        if err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            self._topic_wanted.set()  # deleted, or a broker that lost it: create it again
        self._limited.log(
            logging.WARNING,
            ("undelivered", err.code()),
            time.monotonic(),
            "audit topic %s: events not delivered (%s); dropped and counted",
            self.topic,
            err.str(),
        )

    def _back_off(self, now: float, refused: int) -> None:
        self._full += refused
        self._backoff_s = min(max(self._backoff_s * 2, _BACKOFF_MIN_S), _BACKOFF_MAX_S)
        self._backoff_until = now + self._backoff_s
        self._limited.log(
            logging.WARNING,
            "full",
            now,
            "audit topic %s: the producer's buffer is full (brokers slow or down); %d events dropped and"
            " counted, producing again in %gs",
            self.topic,
            self._full,
            self._backoff_s,
        )
        self._full = 0

    def _error(self, err: KafkaError) -> None:
        """librdkafka's error callback (served by ``poll``, in this thread)."""
        if err.fatal():
            self._broken = err.str()  # an idempotent producer can no longer go on: a new one in tick()
            return
        self._limited.log(
            logging.WARNING,
            ("error", err.code()),
            time.monotonic(),
            "audit topic %s: %s (events wait in the producer up to message.timeout.ms, then are dropped and counted)",
            self.topic,
            err.str(),
        )

    def _replace_producer(self) -> None:
        assert self._producer is not None and self._broken is not None
        lost = len(self._producer)
        _log.warning(
            "audit topic %s: the producer failed (%s); a new one replaces it, %d events in flight dropped",
            self.topic,
            self._broken,
            lost,
        )
        self._broken = None
        old, self._producer = self._producer, None
        try:
            old.purge()
            old.poll(0)  # purged records report failure: counted as dropped there
        except KafkaException:
            pass  # it is being replaced for its errors
        left = len(old)
        if left:
            self._dropped.inc(left)  # records no report will come for
        del old
        self._producer = self._new_producer()
        self._last_report = self._last_success = time.monotonic()

    # --- the topic thread ----------------------------------------------------------------

    def _keep_topic(self) -> None:
        """Create the topic whenever it is wanted (at start, and when it went missing), retrying
        with backoff until it exists or the proxy stops."""
        admin = None
        while True:
            self._topic_wanted.wait()
            if self._stopping.is_set():
                return
            self._topic_wanted.clear()
            delay = _TOPIC_RETRY_MIN_S
            while not self._stopping.is_set():
                try:
                    if admin is None:
                        admin_config: dict[str, Any] = {
                            **self._settings.producer_config(self._upstream),
                            "logger": _LibrdkafkaLog(self._admin_limited),
                        }
                        admin = AdminClient(admin_config)
                    self._create(admin)
                    break
                except Exception as exc:  # unreachable brokers, refused request: retried
                    self._admin_limited.log(
                        logging.WARNING,
                        "create",
                        time.monotonic(),
                        "audit topic %s: cannot make sure it exists (%s); retrying in %gs",
                        self.topic,
                        exc,
                        delay,
                    )
                if self._stopping.wait(delay):
                    return
                delay = min(delay * 2, _TOPIC_RETRY_MAX_S)

    def _create(self, admin: AdminClient) -> None:
        s = self._settings
        new = NewTopic(
            self.topic,
            num_partitions=s.topic_partitions,
            replication_factor=s.topic_replication_factor,
            config=s.new_topic_config,
        )
        future = admin.create_topics([new], request_timeout=_ADMIN_TIMEOUT_S)[self.topic]
        try:
            future.result(timeout=_ADMIN_TIMEOUT_S + 5)
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
                return
            raise
        shown = ", ".join(f"{k}={v}" for k, v in s.new_topic_config.items())
        _log.info("audit topic %s created (%s)", self.topic, shown)
