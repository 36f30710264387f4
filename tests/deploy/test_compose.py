"""docker-compose.yml stays valid and true to the code.

Validation: the compose-spec JSON schema that the `check-jsonschema` wheel vendors (a dev
dependency; no Docker daemon or compose binary needed, nothing fetched at test time). It is
the schema `docker compose config` itself checks against; interpolation is done first, with
every `${VAR:-default}` at its default. Drift: every command of a service running our image
parses with the real `inflight` argparse parser, and every INFLIGHT_* name is a Settings field.
"""

from __future__ import annotations

import copy
import importlib.resources

import jsonschema
import orjson

from inflight.cli.main import build_parser
from inflight.schemas import Settings
from tests.deploy.files import COMPOSE, INFLIGHT_NAME, inflight_services, load_compose


def compose_schema() -> dict:
    path = importlib.resources.files("check_jsonschema") / "builtin_schemas" / "vendor" / "compose-spec.json"
    return orjson.loads(path.read_bytes())


def schema_errors(doc: dict) -> list[str]:
    schema = compose_schema()
    validator = jsonschema.validators.validator_for(schema)(schema)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


def settings_env_names() -> set[str]:
    return {f"INFLIGHT_{name.upper()}" for name in Settings.model_fields}


def test_compose_matches_the_compose_spec_schema():
    assert schema_errors(load_compose()) == []


def test_the_schema_check_catches_mistakes():
    doc = load_compose()
    bad = copy.deepcopy(doc)
    bad["services"]["worker"]["restart_policy"] = "always"  # not a service key
    assert any("restart_policy" in e for e in schema_errors(bad))
    bad = copy.deepcopy(doc)
    bad["services"]["kafka"]["healthcheck"]["interval"] = ["10s"]
    assert schema_errors(bad)


def unparsable_commands(compose: dict) -> list[str]:
    """Services running our image whose command the real `inflight` parser rejects."""
    parser = build_parser()
    bad = []
    for name, svc in inflight_services(compose).items():
        command = svc["command"]
        assert isinstance(command, list) and command, f"{name}: command must be an exec-form list"
        try:
            parser.parse_args(command)
        except SystemExit:
            bad.append(name)
    return bad


def test_every_inflight_command_parses_with_the_cli():
    compose = load_compose()
    services = inflight_services(compose)
    assert {"migrate", "topics", "model", "worker", "recorder", "jobs", "api"} <= set(services)
    assert unparsable_commands(compose) == [], "see argparse's message above"


def test_the_cli_check_catches_a_flag_that_does_not_exist(capsys):
    compose = load_compose()
    compose["services"]["worker"]["command"] = ["worker", "--gpu", "0"]
    compose["services"]["topics"]["command"] = ["topic", "create"]
    assert unparsable_commands(compose) == ["topics", "worker"]
    assert "unrecognized arguments: --gpu" in capsys.readouterr().err


def test_workers_run_on_the_gpu_in_bf16_in_one_group():
    worker = load_compose()["services"]["worker"]
    args = build_parser().parse_args(worker["command"])
    assert args.device.startswith("cuda") and args.dtype == "bfloat16"
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert devices and "gpu" in devices[0]["capabilities"]
    assert "container_name" not in worker, "a fixed container name prevents --scale worker=N"
    assert not worker.get("ports"), "published ports clash between replicas"


def test_two_models_each_in_its_own_group_on_its_own_topics():
    """The shape of a deployment of several models: `worker` serves the default model
    (INFLIGHT_DEFAULT_MODEL: today's topics), `worker-gemma` the bundled Gemma 3 270M on its
    model's topics, which the `topics` job creates; both claim GPUs from the same locks."""
    from inflight.consumers.served_model import Serving
    from inflight.engine.bundled_models import GEMMA3_270M

    compose = load_compose()
    parser = build_parser()
    env = {k: v for k, v in compose["services"]["worker"]["environment"].items()
           if v not in ("", None)}
    settings = Settings(**{k.removeprefix("INFLIGHT_").lower(): v for k, v in env.items()})
    served = {}
    for name in ("worker", "worker-gemma"):
        args = parser.parse_args(compose["services"][name]["command"])
        assert args.device == "cuda:auto" and args.served_model_name
        run = settings.updated(served_model_name=args.served_model_name,
                               model_path=args.model_path)
        served[name] = Serving.of(run, None)
    assert served["worker"].default and served["worker"].topics.requests == "inflight.requests"
    gemma = served["worker-gemma"]
    assert not gemma.default and gemma.model == GEMMA3_270M.folder
    assert gemma.topics.requests == "inflight.requests.model.gemma-3-270m"
    assert gemma.topics.group != served["worker"].topics.group
    topics = parser.parse_args(compose["services"]["topics"]["command"])
    assert topics.model == [gemma.model]
    fetch = parser.parse_args(compose["services"]["model-gemma"]["command"])
    assert fetch.name == GEMMA3_270M.name
    assert compose["services"]["worker-gemma"]["depends_on"]["model-gemma"]["condition"] == \
        "service_completed_successfully"
    assert {v.split(":")[0] for v in compose["services"]["worker-gemma"]["volumes"]} == \
        {v.split(":")[0] for v in compose["services"]["worker"]["volumes"]}


def test_a_worker_claims_its_tensor_parallel_gpus():
    """The shape of a tensor-parallel deployment: every replica sees all GPUs (cuda:auto
    claims a block of INFLIGHT_TENSOR_PARALLEL_SIZE of them) and has room in /dev/shm."""
    worker = load_compose()["services"]["worker"]
    assert build_parser().parse_args(worker["command"]).device == "cuda:auto"
    assert worker["deploy"]["resources"]["reservations"]["devices"][0]["count"] == "all"
    assert int(worker["environment"]["INFLIGHT_TENSOR_PARALLEL_SIZE"]) == 1  # the default shape
    assert worker["shm_size"]


def test_every_inflight_variable_is_a_setting():
    known = settings_env_names()
    compose = load_compose()
    names = set(INFLIGHT_NAME.findall(COMPOSE.read_text()))
    for svc in compose["services"].values():
        env = svc.get("environment") or {}
        names |= {k for k in (env if isinstance(env, dict) else [e.split("=")[0] for e in env])
                  if k.startswith("INFLIGHT_")}
    assert names, "the compose file sets no INFLIGHT_* variable?"
    assert names <= known, f"not Settings fields: {sorted(names - known)}"


def test_environment_values_are_accepted_by_settings(monkeypatch):
    """The values, not only the names: Settings parses the workers' environment."""
    env = load_compose()["services"]["worker"]["environment"]
    for key in list(env):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        if value not in ("", None):
            monkeypatch.setenv(key, str(value))
    s = Settings()
    assert s.kafka_bootstrap == "kafka:9092" and s.dtype == "bfloat16"
    assert s.kv_cache_bytes is None and 0 < s.kv_cache_memory_fraction <= 1  # KV from GPU memory
    assert s.database_url.startswith("postgresql+psycopg://")


def test_services_have_healthchecks_and_restart_policies():
    compose = load_compose()
    for name, svc in compose["services"].items():
        assert "restart" in svc, f"{name}: no restart policy"
    for name in ("kafka", "postgres", "redis", "worker", "recorder", "api"):
        assert "healthcheck" in compose["services"][name], f"{name}: no healthcheck"
    # the API is healthy when it can serve: broker and database reachable, not merely alive
    assert "/readyz" in " ".join(compose["services"]["api"]["healthcheck"]["test"])
    # setup jobs finish before the service starts
    for name in ("worker", "recorder"):
        deps = compose["services"][name]["depends_on"]
        assert {deps[k]["condition"] for k in ("migrate", "topics", "model")} == {
            "service_completed_successfully"}
