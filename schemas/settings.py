"""Settings, read once from INFLIGHT_* environment variables (pydantic-settings).

The object is frozen: components take the fields they need at construction time;
nothing writes back into it after startup.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from inflight.engine.errors import ConfigError


# NOTE: the same name as inflight.engine.model_folder.DEFAULT_MODEL_NAME (the wire does not
# import the engine's model code); tests/schemas check that they agree.
BUNDLED_MODEL_NAME = "SmolLM2-135M-Instruct"


def speculative_json(value: str | None) -> str | None:
    """A speculative_config given as JSON text: None when empty or null, else the text of a
    JSON object (its keys are the engine's to check). ValueError says what is wrong."""
    if value is None or not value.strip() or value.strip() == "null":
        return None
    import json

    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(f"speculative_config is not valid JSON ({exc}); give an object such as "
                         '{"method": "ngram", "num_speculative_tokens": 4}') from None
    if not isinstance(parsed, dict):
        raise ValueError("speculative_config must be a JSON object with vLLM's speculative_config "
                         'keys, such as {"method": "ngram", "num_speculative_tokens": 4}')
    return value


def _data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "inflight"


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "inflight"


ENGINE_OPTION = "engine_option"


def engine_option(default: Any = None) -> Any:
    """A Settings field that is the EngineConfig field of the same name (see Settings)."""
    return Field(default=default, json_schema_extra={ENGINE_OPTION: True})


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="INFLIGHT_", frozen=True, extra="ignore")

    # --- Kafka -------------------------------------------------------------------
    kafka_bootstrap: str = "127.0.0.1:9092"
    kafka_security_protocol: str = "PLAINTEXT"  # PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL
    kafka_sasl_mechanism: str | None = None  # PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512 | OAUTHBEARER
    kafka_sasl_username: str | None = None
    kafka_sasl_password: str | None = None
    kafka_ssl_cafile: str | None = None
    # Any other kafka-python option, as JSON: INFLIGHT_KAFKA_CLIENT_OPTIONS='{"request_timeout_ms": 30000}'
    kafka_client_options: dict[str, Any] = Field(default_factory=dict)
    # The worker's results producer: confluent (librdkafka, far less CPU per message) or
    # kafka-python; any other librdkafka setting of it, as JSON:
    # INFLIGHT_KAFKA_RDKAFKA_OPTIONS='{"linger.ms": 5, "socket.keepalive.enable": true}'
    kafka_worker_producer: Literal["confluent", "kafka-python"] = "confluent"
    # ... and the recorder's consumer (INFLIGHT_KAFKA_RDKAFKA_OPTIONS applies to it too)
    kafka_recorder_consumer: Literal["confluent", "kafka-python"] = "confluent"
    kafka_rdkafka_options: dict[str, Any] = Field(default_factory=dict)
    kafka_session_timeout_ms: int = 10000
    kafka_heartbeat_interval_ms: int = 3000
    # the longest a group member may go between polls before it is put out of the group
    # (the worker's intake polls every few ms, whatever the engine or the broker does)
    kafka_max_poll_interval_ms: int = 300_000
    kafka_max_message_bytes: int = 1_000_000
    # How long the broker may hold a fetch that finds nothing new, for our librdkafka
    # consumers (the recorder, the results readers of the API and Client). Kafka answers
    # a fetch as soon as a record lands, so there it only sets the idle cost (one fetch per
    # this many ms per consumer; Kafka's default is 500); the embedded Tansu holds an empty
    # fetch for all of it, so about half of it is added to every hop on that broker. An
    # idle fetch costs librdkafka (C) little: 10.
    kafka_fetch_max_wait_ms: int = Field(default=10, ge=0)
    # ... the same for our kafka-python consumers (the worker's intake and cancel reader,
    # the recorder on kafka-python), where every idle fetch costs Python CPU (an idle worker:
    # 0.115 CPU s/s at 20, 0.047 at 100) and half of it is a request's wait at the intake
    # on Tansu (submit -> admitted: ~10 ms p50 at 20, ~35 at 100): 20.
    kafka_python_fetch_max_wait_ms: int = Field(default=20, ge=0)
    # how long a producer of ours waits to fill a batch before sending it
    kafka_linger_ms: int = Field(default=2, ge=0)

    topic_requests: str = "inflight.requests"
    topic_requests_batch: str = "inflight.requests.batch"
    topic_results: str = "inflight.results"  # status + final events (the recorder reads these)
    topic_results_tokens: str = "inflight.results.tokens"  # coalesced token deltas (streams)
    topic_dlq: str = "inflight.requests.dlq"
    topic_cancel: str = "inflight.cancel"
    # the model registry: every worker's announcement (compacted, one partition;
    # schemas/registry.py)
    topic_models: str = "inflight.models"
    # OpenTelemetry traces over OTLP/HTTP (docs/tracing.md): off unless an endpoint is set
    # here or in the standard OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT
    otel_exporter_otlp_endpoint: str | None = None
    otel_service_name: str = "inflight"
    # the topics a request's `reply_to` may name (a full-match regular expression); the
    # project's own topics never, and only topics that exist (docs/kafka-contract.md)
    reply_to_pattern: str = r"[A-Za-z0-9._-]+"
    worker_group: str = "inflight-workers"
    recorder_group: str = "inflight-recorder"
    # partitions of a topic a worker or `inflight topics create --model` creates (the
    # request topics of a model; `inflight topics create --partitions` overrides)
    topic_partitions: int = Field(default=4, ge=1)

    # the tenant a Client (and `inflight submit`) stamps on requests that name none
    # (InferenceRequest.tenant; the HTTP API uses the caller key's owner instead)
    tenant: str | None = None

    # --- store ---------------------------------------------------------------------
    database_url: str = Field(default_factory=lambda: f"sqlite:///{_data_dir() / 'inflight.db'}")

    # --- model / engine ------------------------------------------------------------
    model_path: str | None = None  # a Hugging Face folder; None = the bundled SmolLM2-135M
    # the model id a worker serves (and announces; clients send it as `model`); None = the
    # name of the model folder (INFLIGHT_MODEL_PATH's, else the bundled model's)
    served_model_name: str | None = None
    # what the worker's model does: "generate" (text), "embed" (vectors: EmbeddingEngine),
    # or "auto": embed for a sentence-transformers folder (modules.json) or an encoder
    # architecture (BERT), generate otherwise (`inflight worker --model-kind`)
    model_kind: Literal["auto", "generate", "embed"] = "auto"
    # Several models in one deployment: the model whose workers read today's request
    # topics (inflight.requests, inflight.requests.batch) and which a request without a
    # `model` goes to; the others each read their own (transport/model_topics.py). None =
    # one model per deployment: every worker serves the default (an API or client names
    # it by INFLIGHT_SERVED_MODEL_NAME / the folder's name until a worker announces it).
    default_model: str | None = None
    # registry heartbeats: a worker re-announces what it serves this often; readers (the
    # API, clients, batch jobs) drop a worker not heard from for registry_ttl_s
    registry_heartbeat_s: float = Field(default=5.0, gt=0.0)
    registry_ttl_s: float = Field(default=20.0, gt=0.0)
    cache_dir: Path = Field(default_factory=_cache_dir)
    data_dir: Path = Field(default_factory=_data_dir)
    max_prompt_chars: int = 200_000
    # Engine options of a worker: each is the EngineConfig field of the same name (None =
    # the engine's own default), set by INFLIGHT_<NAME> or `inflight worker --<name>` (the
    # flag wins); consumers.engine_bridge.engine_config passes them on, and
    # tests/consumers/test_engine_config.py checks each has its flag and its docs row.
    # A GPU worker: INFLIGHT_DEVICE=cuda INFLIGHT_DTYPE=bfloat16.
    device: str | None = engine_option()  # cpu | cuda | cuda:N | cuda:auto (engine default: cpu)
    dtype: str | None = engine_option()  # float32 | bfloat16 | float16 (engine default: float32)
    max_num_seqs: int | None = engine_option()  # requests running at once (None = worker_max_inflight)
    max_num_batched_tokens: int | None = engine_option()  # token budget of one forward pass (2048)
    max_model_len: int | None = engine_option()  # context cap (None = the checkpoint's)
    kv_cache_bytes: int | None = engine_option()  # KV budget in bytes (engine default: 1 GiB on CPU; CUDA: below)
    kv_cache_memory_fraction: float | None = engine_option()  # CUDA, no kv_cache_bytes: share of the GPU the engine fills (0.9)
    block_size: int | None = engine_option()  # tokens per KV block (16)
    enable_prefix_caching: bool | None = engine_option()  # prefix sharing (engine default: on)
    kernels: str | None = engine_option()  # torch | triton (None = triton on CUDA, torch on CPU)
    cuda_graphs: bool | None = engine_option()  # decode steps as CUDA graphs (None = on for CUDA + triton; 0 = off)
    tensor_parallel_size: int | None = engine_option()  # GPUs (ranks) one worker shards its model over (1)
    kv_cache_dtype: str | None = engine_option()  # auto (the model dtype) | int8 | fp8 (e4m3); None = auto
    # speculative decoding, vLLM's speculative_config as JSON (None/empty = off), e.g.
    # INFLIGHT_SPECULATIVE_CONFIG='{"method": "ngram", "num_speculative_tokens": 4}'; the
    # engine checks the keys (engine/spec/config.py)
    speculative_config: str | None = engine_option()
    # fair share between tenants within a priority class (None = the engine's default: on;
    # false = first come, first served) and the tenants' weights as JSON, e.g.
    # INFLIGHT_TENANT_WEIGHTS='{"team-a": 1, "team-b": 3}' (others weigh 1); docs/tenants.md
    fair_share: bool | None = engine_option()
    tenant_weights: str | None = engine_option()
    # LoRA adapters (engine/lora, docs/lora.md): slots resident at once (0 = none; None =
    # as many as worker_loras names), the largest rank, adapters kept read in host memory
    max_loras: int | None = engine_option()
    max_lora_rank: int | None = engine_option()
    max_cpu_loras: int | None = engine_option()
    # adapters a worker serves from its start, {name: PEFT folder}, as JSON:
    # INFLIGHT_WORKER_LORAS='{"team-a": "/adapters/a"}'; `inflight worker --lora NAME=PATH`
    worker_loras: dict[str, str] = Field(default_factory=dict)
    # API keys (their owners or key ids) that may load and unload LoRA adapters at run time
    # (POST /v1/load_lora_adapter, /v1/unload_lora_adapter), as JSON: '["ops"]'; with
    # INFLIGHT_API_AUTH=off anyone may
    api_lora_admins: list[str] = Field(default_factory=list)
    # --device cuda:auto: workers of one host claim distinct GPUs through lock files here
    gpu_lock_dir: Path | None = None  # None = <data_dir>/gpu-locks

    # --- batch jobs ----------------------------------------------------------------
    # Celery broker: redis://host:6379/0 in production. None = the embedded transport
    # (kombu's filesystem transport in <data_dir>/celery: no server, one machine).
    celery_broker: str | None = None
    celery_queue: str = "inflight-batch"   # the Celery queue of batch tasks
    batch_sweep_interval_s: float = 10.0   # period of the sweep (counts, finalize, expire)
    batch_lease_s: float = 120.0           # a dead sweeper's / enqueuer's claim lapses after this
    batch_cancel_grace_s: float = 600.0    # cancelling: requests not final by then end `cancelled`
    batch_enqueue_chunk: int = 1000        # lines per store insert + producer flush + progress update
    # Context length checked against max_tokens at validation; None = max_position_embeddings
    # from <model folder>/config.json (read as JSON; the model is never loaded).
    batch_context_length: int | None = None
    # OpenAI's rule: every line of a batch file names the same model (off: a file may mix
    # models line by line, each line going to its model's batch topic)
    batch_one_model_per_file: bool = False
    # --- pipelines: webhooks and the batch-events topic (docs/batch-jobs.md) -----------
    # plain-http webhook endpoints are refused except to these hosts (comma-separated;
    # https is always allowed; link-local and cloud-metadata addresses never are)
    webhook_allow_hosts: str = ""
    webhook_interval_s: float = 1.0        # period of the delivery task (the jobs worker)
    webhook_timeout_s: float = 10.0        # one delivery attempt's HTTP timeout
    webhook_retry_base_s: float = 5.0      # first retry after this; doubling each time
    webhook_retry_max_s: float = 3600.0    # ... up to this
    webhook_max_attempts: int = Field(default=10, ge=1)   # then the delivery is `failed`
    # an endpoint is disabled (with the reason) after this many failed attempts in a row
    webhook_disable_after: int = Field(default=30, ge=1)
    topic_batch_events: str = "inflight.batch-events"   # batch state events, key = batch id
    # file content (uploads, batch inputs and outputs) on object storage: s3://bucket/prefix
    # (any S3-compatible store; credentials from the AWS_* environment). None: the database
    files_url: str | None = None
    files_s3_endpoint: str | None = None   # an S3-compatible store's URL (None: AWS's)

    # --- worker ----------------------------------------------------------------------
    worker_max_inflight: int = 64
    # requests a worker reads ahead of those (they wait in the engine's queue, shown as
    # running): fair share and deadlines choose among what the worker holds, so a small
    # tenant's requests behind another's flood in the partitions are seen and served
    # (docs/tenants.md); 0 = hold only worker_max_inflight
    worker_read_ahead: int = Field(default=4096, ge=0)
    # refuse (error `invalid_request`, field tenant) a Kafka request that names no tenant
    require_tenant: bool = False
    # per-tenant token counters carry a `tenant` label (cardinality: one series per tenant)
    tenant_metrics: bool = False
    # create the worker's request topics (and the shared ones) at start when they are
    # missing, if the broker allows it (a refusal is logged; `inflight topics create --model`)
    worker_create_topics: bool = True
    metrics_port: int | None = None  # worker's /metrics port; the recorder serves on port + 1
    metrics_host: str = "127.0.0.1"  # 0.0.0.0 in a container, so Prometheus can scrape it
    # Idempotent producers break on Tansu after a broker restart: off unless asked for.
    kafka_enable_idempotence: bool = False
    # cancels stamped this far back are honoured by a worker that starts later (a request
    # can wait that long in a backlog); 24 h = the OpenAI batch completion window
    cancel_lookback_s: float = Field(default=86_400.0, ge=0.0)
    worker_drain_timeout_s: float = 30.0  # SIGTERM: finish in-flight work for this long, then hand back
    metrics_interval_s: float = 10.0  # one-line summary period (0 = never)
    metrics_lag_interval_s: float = 5.0  # consumer-lag probe period (only with a metrics port)
    # records per recorder batch (one upsert + one database commit each): each commit waits
    # for the WAL flush, so at thousands of requests a second fewer, larger batches win
    recorder_batch_size: int = 2000
    # token deltas: one event per request carries every token since its last one, flushed
    # every stream_interval_ms or as soon as it holds stream_max_tokens tokens
    stream_interval_ms: int = Field(default=50, ge=0)
    stream_max_tokens: int = Field(default=256, ge=1)

    # --- HTTP API (api/, `inflight api`) -------------------------------------------------
    # INFLIGHT_API_AUTH=off serves everyone without a key: only for the local demo (logged loudly).
    api_auth: bool = True
    api_max_body_bytes: int = 4_000_000        # JSON bodies (single requests, chat completions)
    api_max_upload_bytes: int = 200_000_000    # one uploaded batch file / message-batch body
    api_max_upload_lines: int = 50_000         # lines (requests) in one batch file
    api_max_line_bytes: int = 1_000_000        # one line of a batch file
    # a file still `uploading` this long after its upload began was left by a writer that
    # died (kill -9 mid-write): the API's sweep deletes it with its chunks (every half of
    # this, at most every minute). Longer than any upload takes.
    api_upload_grace_s: float = Field(default=3600.0, gt=0.0)
    api_key_cache_s: float = 2.0               # a verified key is re-checked for revocation this often
    api_wait_timeout_s: float = 600.0          # chat completions: wait this long for the final event
    # open streams per process (SSE, streamed and waiting chat/text completions), then 503:
    # all follow one results reader; each holds its events not yet sent (a few KB)
    api_max_streams: int = Field(default=10_000, ge=1)
    api_final_cache_bytes: int = 64_000_000    # answers of finished requests kept per process (0 = off)
    # the public base URL of the API (https://inference.example.com) for links it hands out
    # (a message batch's results_url); None = links relative to the API's root
    api_public_url: str | None = None
    api_publish_timeout_s: float = 10.0        # a submit waits this long for Kafka's ack (then 503)
    # a request waiting in the queue: streams send a keep-alive (an SSE comment, Anthropic's
    # `ping`) every this many seconds without an event, and a waiting (not streamed)
    # completion that has no answer after this long starts its 200 and sends a space every
    # as long, then its JSON (api_keepalive_waiting=False: not those); 0 = no keep-alive
    api_keepalive_s: float = Field(default=15.0, ge=0.0)
    api_keepalive_waiting: bool = True

    @field_validator("speculative_config")
    @classmethod
    def _speculative_json(cls, value: str | None) -> str | None:
        return speculative_json(value)

    @field_validator("tenant_weights")
    @classmethod
    def _tenant_weights(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        import json

        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"tenant_weights is not valid JSON ({exc}); give an object such "
                             'as {"team-a": 1, "team-b": 3}') from None
        if not isinstance(parsed, dict) or not all(
                isinstance(w, (int, float)) and not isinstance(w, bool) and 0 < w < float("inf")
                for w in parsed.values()):
            raise ValueError('tenant_weights: give a JSON object {"tenant": weight}, weights '
                             "positive numbers")
        return value

    @classmethod
    def engine_option_names(cls) -> list[str]:
        """The fields that are EngineConfig fields (engine_option())."""
        return [name for name, f in cls.model_fields.items()
                if isinstance(f.json_schema_extra, dict) and f.json_schema_extra.get(ENGINE_OPTION)]

    def engine_options(self) -> dict[str, Any]:
        """{EngineConfig field: value} of the engine options that are set (not None)."""
        return {name: getattr(self, name) for name in self.engine_option_names()
                if getattr(self, name) is not None}

    def updated(self, **changes: Any) -> "Settings":
        """A validated copy with `changes` (a command's flags over INFLIGHT_*); a value that
        does not fit its field is a ConfigError naming the field."""
        try:
            return type(self).model_validate({**self.model_dump(), **changes})
        except ValidationError as exc:
            err = exc.errors()[0]
            name = ".".join(str(p) for p in err["loc"]) or "settings"
            raise ConfigError(f"{name}={changes.get(name, '')!r}: {err['msg']} "
                              f"(INFLIGHT_{name.upper()} or its flag)") from None

    def kafka_common(self) -> dict[str, Any]:
        """kafka-python keyword arguments shared by producers, consumers and admin clients."""
        opts: dict[str, Any] = {
            "bootstrap_servers": [s.strip() for s in self.kafka_bootstrap.split(",") if s.strip()],
            "security_protocol": self.kafka_security_protocol,
        }
        if self.kafka_sasl_mechanism:
            opts["sasl_mechanism"] = self.kafka_sasl_mechanism
            opts["sasl_plain_username"] = self.kafka_sasl_username
            opts["sasl_plain_password"] = self.kafka_sasl_password
        if self.kafka_ssl_cafile:
            opts["ssl_cafile"] = self.kafka_ssl_cafile
        opts.update(self.kafka_client_options)
        return opts

    def rdkafka_common(self) -> dict[str, Any]:
        """The same connection as librdkafka (confluent-kafka) configuration."""
        # NOTE: Nagle off, as kafka-python has it: with it on, a small request sent while
        # the previous one is unacknowledged waits for the broker's delayed ACK (the first
        # token delta right behind a request's status event waited ~20-40 ms)
        opts: dict[str, Any] = {"bootstrap.servers": self.kafka_bootstrap,
                                "security.protocol": self.kafka_security_protocol.lower(),
                                "socket.nagle.disable": True}
        if self.kafka_sasl_mechanism:
            opts["sasl.mechanism"] = self.kafka_sasl_mechanism
            opts["sasl.username"] = self.kafka_sasl_username
            opts["sasl.password"] = self.kafka_sasl_password
        if self.kafka_ssl_cafile:
            opts["ssl.ca.location"] = self.kafka_ssl_cafile
        return opts

    def served_model_id(self) -> str:
        """The model id these settings serve: INFLIGHT_SERVED_MODEL_NAME, else the model
        folder's name (INFLIGHT_MODEL_PATH's, else the bundled model's)."""
        if self.served_model_name:
            return self.served_model_name
        return Path(self.model_path).name if self.model_path else BUNDLED_MODEL_NAME

    def default_model_id(self) -> str:
        """The deployment's default model as these settings name it (INFLIGHT_DEFAULT_MODEL,
        else served_model_id): what a request without `model` runs on. A live registry
        entry of the default model says its real name (producers/models_client.py)."""
        return self.default_model or self.served_model_id()

    def webhook_allowed_hosts(self) -> frozenset[str]:
        """INFLIGHT_WEBHOOK_ALLOW_HOSTS as a set of lower-case host names / addresses."""
        return frozenset(h.strip().lower().strip("[]") for h in self.webhook_allow_hosts.split(",")
                         if h.strip())

    def topics(self) -> list[str]:
        return [self.topic_requests, self.topic_requests_batch, self.topic_results,
                self.topic_results_tokens, self.topic_dlq, self.topic_cancel, self.topic_models,
                self.topic_batch_events]
