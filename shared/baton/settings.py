"""Process settings: one frozen object built from ``BATON_*`` environment variables.

Build it once in an entry point with :meth:`Settings.from_env` and pass it down; nothing in
Baton reads the environment at import time.
"""

from __future__ import annotations

import contextvars
import os
import socket
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic import ValidationError as PydanticValidationError

from baton.errors import ConfigError

ENV_PREFIX = "BATON_"
# Provider variables read when their BATON_ form is not set (the names the providers' own
# tools use).
FALLBACK_ENV = {
    "openai_api_key": "OPENAI_API_KEY",
    "openai_base_url": "OPENAI_BASE_URL",
    "anthropic_api_key": "ANTHROPIC_API_KEY",
    "anthropic_base_url": "ANTHROPIC_BASE_URL",
}


#: How an invalid value is named in the error: by its field, or (from_env) its variable.
_NAMES: contextvars.ContextVar[str] = contextvars.ContextVar("baton_settings_names",
                                                             default="")
#: The URL schemes of BATON_REDIS_URL (see baton.store.redis_client).
REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")


def _problems(exc: PydanticValidationError, prefix: str) -> str:
    """pydantic's errors as one line: ``<FIELD>: <what is wrong>; ...`` (never the value)."""
    def name(e: Any) -> str:
        field = ".".join(str(p) for p in e["loc"])
        return f"{prefix}{field.upper()}" if prefix else field
    return "; ".join(f"{name(e)}: {e['msg'].removeprefix('Value error, ')}"
                     for e in exc.errors())


class Settings(BaseModel):
    """Everything a Baton process needs to know about its environment."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # rediss://user:password@host:port/0 for TLS and a per-role ACL user; a Redis Cluster by
    # its seed nodes: redis+cluster://[user:password@]host1:port1,host2:port2 (rediss+cluster
    # for TLS). See baton.store.redis_client.
    redis_url: str = Field(default="redis://127.0.0.1:6379/0", repr=False)
    # One URL, or several separated by commas (the seed servers of a NATS cluster).
    nats_url: str = "nats://127.0.0.1:4222"
    # How often a client pings its NATS server; after two unanswered pings it drops the
    # connection and moves to another server. A node cut off by a partition sends no reset,
    # so without pings a client would wait on it for minutes (nats-py's default: 2 min x 2).
    nats_ping_interval_s: float = Field(default=2.0, gt=0)

    # Credentials and TLS. NATS: a user and password, or a credentials file (JWT + NKey).
    nats_user: str = ""
    nats_password: str = Field(default="", repr=False)
    nats_creds: str = ""
    nats_tls_ca: str = ""  # CA bundle that signed the servers' certificates
    nats_tls_cert: str = ""  # client certificate and key, for servers that verify clients
    nats_tls_key: str = ""
    redis_tls_ca: str = ""  # with a rediss:// URL
    redis_tls_cert: str = ""
    redis_tls_key: str = ""
    # Prefix of every Redis key, NATS subject and stream name: isolates deployments and tests.
    namespace: str = Field(default="baton", pattern=r"^[a-z][a-z0-9_-]{0,31}$")
    # Sessions are spread over this many hash-tagged shards (outbox stream + timer set each).
    shards: int = Field(default=16, ge=1, le=4096)
    # How long a Brain or Hands logging in as its role waits for a relay to make its durable
    # consumer (baton.bus.consumers) before it gives up starting.
    consumer_wait_s: float = Field(default=120.0, gt=0)
    stream_replicas: int = Field(default=1, ge=1, le=5)
    # With replicated streams, a worker's waiting pull asks its consumer for an idle heartbeat
    # this often, and a silence of three finds a consumer whose leader died (then it reads
    # around it until another is elected, baton.bus.fallback). 0: no heartbeats. Unused with
    # one replica: a lost stream node is then a lost connection, seen at once.
    consumer_heartbeat_s: float = Field(default=0.25, ge=0, le=30)
    stream_storage: str = Field(default="file", pattern="^(file|memory)$")
    duplicate_window_s: float = Field(default=120.0, gt=0)
    # Limits of each JetStream stream (wakes, tools). A full stream refuses new messages
    # (discard "new"): the relay keeps the rows in the outbox and retries, so nothing is lost
    # by the limit, and the backlog is visible. Messages older than the age are dropped: a
    # subject nobody consumes must not grow forever (`baton inspect` reports it long before);
    # lost wakes and tool messages of live sessions are repeated by deadlines and redispatch.
    # Bytes are bounded by max_msgs x max_payload_bytes (the messages are small pointers,
    # ~100-300 bytes); an explicit byte limit (0 = none) is the operator's choice, sized to the
    # servers' disks: JetStream reserves it on every replica when a stream is created, and
    # refuses to place a stream with one on a peer whose storage it has not heard about yet
    # (a node just restarted), so creating a namespace's streams then fails for a while.
    stream_max_msgs: int = Field(default=1_000_000, ge=1)
    stream_max_bytes: int = Field(default=0, ge=0)
    stream_max_age_s: float = Field(default=7 * 24 * 3600.0, ge=60)

    # Brain
    # A dead Brain's sessions are taken over once its lease lapses (renewed every lease/3).
    lease_ms: int = Field(default=3_000, ge=100)
    brain_concurrency: int = Field(default=64, ge=1)
    # A pass that dispatched tool runs keeps the lease this long for their results, which
    # then come straight from the Hands' commit instead of through the relay (brain.held);
    # then it releases. 0: never hold (every result wakes the session through the relay).
    brain_hold_ms: int = Field(default=1_000, ge=0)
    restart_limit: int = Field(default=3, ge=1)
    # Failures to decode or process a session's state before it is quarantined
    # (baton.store.quarantine).
    poison_limit: int = Field(default=3, ge=1)
    progress_deadline_ms: int = Field(default=15_000, ge=100)
    # Lifecycle (baton.store.retention): a settled session (nothing live: no open task,
    # run, timer, approval or request) stays in Redis this long, then is written to the
    # archive (archive_url) and removed from Redis; an agent's Agent(retention=...) wins.
    session_retention_s: float = Field(default=86_400.0, gt=0)
    # Where archived sessions go: a local directory (a path, or file:///abs/path) or an
    # S3-compatible store (s3://bucket/prefix; credentials, region and endpoint from the
    # standard AWS_* variables). "" : <BATON_HOME or ./.baton>/archive.
    archive_url: str = ""
    # How long the small tombstone of an archived session stays in Redis: it refuses late
    # messages, results and stale workers for the session at once, and lets reads and
    # listings find the archive object without asking the archive. Past it the archive is
    # asked: reads and a new submission find the session there (its fence kept), and a late
    # message for it finds no session (dead-lettered, as ever).
    tombstone_ttl_s: float = Field(default=86_400.0, gt=0)
    # How long the liveness record of a worker that stopped without withdrawing it (killed,
    # its host lost) stays for inspect to show it as gone; then a live worker of its role
    # deletes it (baton.store.workers.prune_gone, every few minutes).
    dead_worker_keep_s: float = Field(default=86_400.0, gt=0)
    entries_page: int = Field(default=200, ge=1)
    # About how many receipts (the commit log: trace, watch, the console) a session keeps in
    # Redis, per role's stream (the Brains', the Hands', the clients'): each receipt trims the
    # oldest of its stream past this (XADD MAXLEN ~), so a receipt costs the same however old
    # the session is; trace and the archive then hold the newest ones.
    receipts_kept: int = Field(default=10_000, ge=100)
    # The entries a Brain caches from its earlier leases, as bytes of their JSON (all sessions
    # together, least recently leased dropped first): a lease of a session cached reads only
    # the entries appended since (baton.store.entry_cache). 0: every lease reads the page.
    entry_cache_bytes: int = Field(default=64 * 1024 * 1024, ge=0)
    # A document is stored in full every this many versions, as merge-patch deltas between.
    document_baseline_every: int = Field(default=16, ge=1)

    # Hands
    # Takeover of a dead Hands' tool run: JetStream redelivers after ack_wait, the attempt
    # is reclaimed once its heartbeat is older than attempt_ttl (both beat every third of
    # it while a tool runs longer than that). A stall past them is a false takeover: safe
    # (fenced), but it ends an unsafe tool's run interrupted, so do not go much lower.
    attempt_ttl_ms: int = Field(default=1_200, ge=100)
    ack_wait_s: float = Field(default=1.2, gt=0)
    # The tool consumers' ack_wait: a dead Hands' message comes back to a live replica this
    # soon. The live one asks the holder over NATS whether its connection is still there
    # (hands.liveness); only when NATS answers "no responders" is the attempt taken over
    # before attempt_ttl. A redelivery while the holder is alive costs a ping and a nak.
    tool_ack_wait_s: float = Field(default=0.3, gt=0)
    max_deliver: int = Field(default=8, ge=1)
    hands_concurrency: int = Field(default=64, ge=1)  # tool runs in flight, per tool
    tool_output_limit: int = Field(default=64 * 1024, ge=256)
    # The tools' shared HTTP client (ctx.http, baton.hands.http): a response body past
    # tool_http_max_bytes (as sent or once decoded) ends its request with ResponseTooLarge,
    # and a response not whole within tool_http_deadline_s of its request (however slowly
    # the server drips it) with RequestDeadlineExceeded. A URL a model chose can neither
    # fill a Hands' memory (hands_concurrency bodies of this size per tool at most) nor hold
    # a call past its deadline. A request may ask for other bounds (its extensions).
    tool_http_max_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    tool_http_deadline_s: float = Field(default=30.0, gt=0)

    # Relay
    relay_batch: int = Field(default=256, ge=1)
    relay_claim_idle_ms: int = Field(default=3_000, ge=100)
    # How late a due timer may fire: timer_tick_ms while the relay has moved rows or been
    # notified in the last few seconds (a Brain notifies the relays when a commit arms a
    # timer, baton.bus.timer_notify). An idle relay sleeps until its earliest timer is due
    # and looks at least every timer_idle_tick_ms, the bound on lateness should a timer
    # notification be lost.
    timer_tick_ms: int = Field(default=200, ge=10)
    timer_idle_tick_ms: int = Field(default=10_000, ge=10)
    # How often the relay sweeps its shards' inboxes for requests no Brain took up (their
    # wake was lost) and wakes their sessions: every relay_sweep_ms those of the requests
    # whose wakes it published since the last sweep (an index; a wake message lost after
    # its publish); every relay_scan_ms, and at once for every shard it takes, every inbox
    # of the keyspace (a SCAN: about a second of Redis CPU per million keys), which also
    # finds a request whose wake row was deleted before a relay read it.
    relay_sweep_ms: int = Field(default=60_000, ge=100)
    relay_scan_ms: int = Field(default=3_600_000, ge=1_000)

    # Limits and lifecycle
    max_payload_bytes: int = Field(default=1024 * 1024, ge=1024)
    # On SIGTERM a worker takes no new messages and waits this long for the work in hand,
    # then cancels what is left. A Hands sets it above the app's longest tool timeout, so no
    # run is cut mid-call (deploy/k8s/hands.yaml: 35 s). A Brain's work is never lost to it
    # but may be redone: a model call can last up to model_call_timeout_s, longer than a
    # stop should wait, so a pass still working when the drain runs out is handed over (its
    # lease released and its wake sent back at once; the next Brain leases the session and
    # calls the model again from the last commit, and the restart limit does not count it).
    # Raise a Brain's drain to spare those calls at the cost of slower stops; the grace
    # period of its pod or container must exceed it plus telemetry_flush_timeout_s.
    drain_timeout_s: float = Field(default=10.0, ge=0)
    # At exit, how long a process waits for its last spans and metrics to reach the
    # collector (OTEL_*): an unreachable one would otherwise hold each exit for the
    # exporters' retries (10 s each by default). What is not out by then is dropped.
    telemetry_flush_timeout_s: float = Field(default=3.0, ge=0)
    connect_timeout_s: float = Field(default=2.0, gt=0)
    # How long a client waits for a store that answers but refuses for now (a replica
    # catching up under the split-brain guard, NOREPLICAS; a failover, CLUSTERDOWN): its
    # connect, and each of its writes (submit, start, cancel, approve, reject, all
    # idempotent) and reads, before raising RedisUnavailable naming the shard and the
    # reason. Workers wait without bound (they are services).
    client_connect_wait_s: float = Field(default=10.0, ge=0)
    # Connections per process; callers past it wait for one (a blocking pool).
    redis_max_connections: int = Field(default=512, ge=4)
    # A transition is acknowledged only once this many replicas have it (WAIT after each
    # script, see baton.store.replication). Unset: 1 on a Redis Cluster, 0 on one server
    # (no WAIT). The cluster must have that many replicas per primary.
    redis_min_replicas: int | None = Field(default=None, ge=0, le=5)
    # How long each WAIT waits for the replicas' acknowledgement.
    redis_replica_timeout_ms: int = Field(default=1_000, ge=1)
    # How long a write in doubt (no acknowledgement in time, or the connection dropped after
    # the script) is retried with its commit id before WriteInDoubtError: long enough for a
    # failover (a few cluster-node-timeouts) so that a promoted replica takes the retry.
    redis_in_doubt_retry_ms: int = Field(default=10_000, ge=0)
    # GET /healthz (live) and /readyz (ready, 503 while draining) on this port; 0 = off.
    health_port: int = Field(default=0, ge=0, le=65535)
    # The address the health endpoint listens on: every interface by default (an
    # orchestrator probes the pod's address); 127.0.0.1 on a shared host, where the probe
    # is local (`baton health --port` asks this address when it is not a wildcard).
    health_host: str = Field(default="0.0.0.0", min_length=1, max_length=255)

    # The HTTP API (baton.api). Host names it answers besides the loopback names and the
    # address it is bound to, comma-separated ("*": any, behind a proxy that checks Host):
    # a request naming another Host (DNS rebinding) is refused.
    api_hosts: str = ""
    # Open event streams (SSE) per API process, and per token (anonymous callers share
    # one): past either a new stream is answered 429 with Retry-After. Each session
    # followed holds one Redis connection, so these bound what one reader can hold.
    api_max_streams: int = Field(default=2_000, ge=1)
    api_max_streams_per_token: int = Field(default=1_000, ge=1)
    # Bytes of changes queued for one stream (and kept per session for streams resuming
    # behind it): a stream that falls further behind is ended, and resumes.
    api_stream_queue_bytes: int = Field(default=8 * 1024 * 1024, ge=64 * 1024)

    # Models (brain.model): provider endpoints, keys, timeouts, streaming and retries. Keys
    # come from the environment only: BATON_OPENAI_API_KEY or OPENAI_API_KEY, and
    # BATON_ANTHROPIC_API_KEY or ANTHROPIC_API_KEY (likewise *_BASE_URL).
    openai_base_url: str = ""  # default https://api.openai.com/v1; openai-compatible needs one
    openai_api_key: str = Field(default="", repr=False)
    anthropic_base_url: str = ""  # default https://api.anthropic.com
    anthropic_api_key: str = Field(default="", repr=False)
    model_stream: bool = True  # stream answers (SSE); False asks for one JSON answer
    # "[provider:]model": every agent of the app runs on this model instead of the one its
    # code names (`baton dev up --model openai:gpt-4o-mini`: a real model, no app module).
    agent_model: str = ""
    model_connect_timeout_s: float = Field(default=5.0, gt=0)
    # Longest silence while waiting for the answer's next bytes; the whole call is bounded too.
    model_read_timeout_s: float = Field(default=60.0, gt=0)
    model_call_timeout_s: float = Field(default=600.0, gt=0)
    model_max_tokens: int = Field(default=4096, ge=1)
    # Which Chat Completions field carries model_max_tokens: "auto" sends
    # max_completion_tokens to openai: (OpenAI deprecates max_tokens for every chat model;
    # its reasoning models refuse it) and max_tokens to openai-compatible: servers (what
    # they accept).
    openai_max_tokens_field: str = Field(
        default="auto", pattern="^(auto|max_tokens|max_completion_tokens)$")
    # Streamed text is saved for watchers at most this often (losable partial commits).
    model_partial_interval_ms: int = Field(default=100, ge=10)
    # Retryable model failures: exponential backoff from base to max, given up after deadline.
    model_backoff_ms: int = Field(default=500, ge=1)
    model_backoff_max_ms: int = Field(default=30_000, ge=1)
    model_retry_deadline_s: float = Field(default=300.0, gt=0)
    # Fleet-wide budgets per provider and model (baton.budgets), as JSON: {"openai/gpt-4o-mini":
    # {"rpm": 500, "tpm": 200000, "concurrency": 50, "burst_s": 1}}; over the App's own.
    model_budgets: str = ""

    # Fair admission of new sessions between tenants (baton.store.admission). 0: off, new
    # sessions start in arrival order. N > 0: at most N new sessions are starting at once
    # (their first wake sent, no Brain has it yet; spread over the shards); the others wait
    # in Redis in order of priority, then of fair share between tenants with waiting work,
    # so one tenant's burst cannot delay another's sessions by the whole burst.
    admission_window: int = Field(default=0, ge=0)
    # A starting session no Brain received within this long counts as received (its place
    # goes to the next in line; the Brain that takes it late still runs it).
    admission_start_ms: int = Field(default=30_000, ge=100)
    # The tenant of this process's submissions that name none, and the tenants' shares of
    # admission: "acme=3,globex=1" (1 to 100; a tenant not named has 1).
    tenant: str = Field(default="default", pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    tenant_weights: str = Field(default="", pattern=r"^([A-Za-z0-9_.-]{1,64}=\d{1,3},?)*$")
    # Bounds on waiting work (new sessions submitted and not yet received by a Brain), in
    # total and per tenant, with admission on; 0: none. Past one, Client.submit raises
    # BacklogFullError (retryable) and the API answers 429 with Retry-After, nothing written.
    max_waiting: int = Field(default=0, ge=0)
    max_waiting_per_tenant: int = Field(default=0, ge=0)
    admission_retry_after_s: float = Field(default=1.0, gt=0)

    mail_url: str = "http://127.0.0.1:8025"
    worker_name: str = ""
    log_level: str = "info"
    log_format: str = Field(default="auto", pattern="^(auto|json|console)$")
    # The canonical line of every handled message at INFO; by default only the unusual ones
    # (redelivered, recovered, failed), the routine ones counted in a summary line every 10 s.
    log_each_message: bool = False
    # The services' event loop: "uvloop" (libuv: less CPU per message and per Redis or NATS
    # round trip), "asyncio" (the standard library's), or "auto" (uvloop where it is
    # installed, which the package's dependencies do except on Windows).
    event_loop: str = Field(default="auto", pattern="^(auto|uvloop|asyncio)$")
    fault: str = ""  # named fault point, for crash tests only: "point" or "point@N"

    def __init__(self, **values: Any) -> None:
        """Settings from keyword values; an invalid one is a ConfigError naming it."""
        try:
            super().__init__(**values)
        except PydanticValidationError as exc:
            raise ConfigError(f"invalid settings: {_problems(exc, _NAMES.get())}") from None

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, url: str) -> str:
        scheme = url.partition("://")[0].lower() if "://" in url else ""
        if scheme not in REDIS_SCHEMES:
            # never the URL itself: it may carry a password
            schemes = ", ".join(f"{s}://" for s in REDIS_SCHEMES)
            raise ValueError(f"a Redis URL starts with {schemes} "
                             f"(got {scheme + '://' if scheme else 'no scheme'})")
        return url

    @field_validator("model_budgets")
    @classmethod
    def _model_budgets(cls, text: str) -> str:
        from baton.budgets import parse_budgets

        try:
            parse_budgets(text)
        except ConfigError as exc:
            raise ValueError(exc.message) from None
        return text

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read ``BATON_<FIELD>`` variables (upper case) and apply explicit overrides."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for name in cls.model_fields:
            key = ENV_PREFIX + name.upper()
            if key in env and env[key] != "":
                values[name] = env[key]
            elif env.get(FALLBACK_ENV.get(name, "")):
                values[name] = env[FALLBACK_ENV[name]]
        values.update({k: v for k, v in overrides.items() if v is not None})
        names = _NAMES.set(ENV_PREFIX)  # a bad value is named by its variable
        try:
            return cls.model_validate(values)
        finally:
            _NAMES.reset(names)

    def archive_location(self) -> str:
        """Where archived sessions go: ``archive_url``, else ``<BATON_HOME>/archive`` (the
        embedded default; ``BATON_HOME`` defaults to ``./.baton``)."""
        if self.archive_url:
            return self.archive_url
        home = os.environ.get("BATON_HOME") or os.path.join(os.getcwd(), ".baton")
        return os.path.join(os.path.abspath(home), "archive")

    def min_replicas(self) -> int:
        """Replicas that must acknowledge a write: the setting, or 1 on a cluster, else 0."""
        if self.redis_min_replicas is not None:
            return self.redis_min_replicas
        return 1 if self.redis_url.split("://", 1)[0].lower().endswith("+cluster") else 0

    def worker_id(self, role: str) -> str:
        """A readable unique worker name: the configured one, or role-host-pid."""
        if self.worker_name:
            return self.worker_name
        return f"{role}-{socket.gethostname()}-{os.getpid()}"

    def to_env(self) -> dict[str, str]:
        """The environment that recreates these settings in a child process."""
        out = {}
        for name, value in self.model_dump().items():
            if value != type(self).model_fields[name].default:
                out[ENV_PREFIX + name.upper()] = str(value)
        return out
