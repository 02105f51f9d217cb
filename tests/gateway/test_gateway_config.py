"""ServeConfig and the SLOTSERVE_* registry: precedence, aliases, loud failures."""

from __future__ import annotations

import argparse

import pytest
from slotserve.gateway.cli import configure
from slotserve.gateway.config import ServeConfig
from slotserve.gateway.options import OPTIONS, config_from_args
from slotserve.gateway.runtime import scheduler_config
from slotserve.scheduler.prefill_order import PrefillOrder


def parse(argv: list[str], env: dict[str, str] | None = None) -> ServeConfig:
    parser = argparse.ArgumentParser()
    configure(parser)
    return config_from_args(parser.parse_args(argv), environ=env or {})


def test_defaults_are_safe() -> None:
    c = parse([])
    assert c.host == "127.0.0.1"
    assert c.port == 8080
    assert c.api_key is None
    assert c.kv_disk_dir is None  # nothing written to disk unless asked
    # no default max_tokens: a request without one runs to the end of its turn or context,
    # bounded by --max-tokens-limit
    assert c.default_max_tokens is None and c.max_tokens_limit == 32768
    assert c.max_body_bytes == 4 * 1024 * 1024


def test_the_api_key_never_appears_in_the_config_repr() -> None:
    c = ServeConfig(api_key="s3cret-key")
    assert c.api_key == "s3cret-key"
    assert "s3cret-key" not in repr(c) and "s3cret-key" not in str(c)


def test_command_line_beats_environment_beats_default() -> None:
    env = {"SLOTSERVE_PORT": "9001", "SLOTSERVE_CTX_SIZE": "2048"}
    c = parse(["--port", "9002"], env)
    assert c.port == 9002  # flag wins
    assert c.ctx_size == 2048  # env beats the default


def test_parallel_is_an_alias_of_batched_session() -> None:
    assert parse(["--parallel", "3"]).batched_session == 3
    assert parse(["-np", "5"]).batched_session == 5
    assert parse(["--batched-session", "2"]).batched_session == 2


def test_every_option_has_an_env_var_that_parses() -> None:
    samples = {int: "100", float: "1.5", str: "x"}
    for opt in OPTIONS:
        if opt.kind == "flag":
            raw = "true"
        elif opt.kind == "names":
            raw = "a, b"
        else:
            raw = samples.get(opt.parse, "x")
        env = {opt.env: raw}
        if opt.field == "kv_disk_space_mb":
            env["SLOTSERVE_KV_DISK_DIR"] = "/tmp/kv"
        if opt.field == "log_level":
            env[opt.env] = "debug"
        if opt.field == "prefill_order":
            env[opt.env] = "fifo"
        if opt.field == "speculative":
            env[opt.env] = "off"
        if opt.field == "kv_type":
            env[opt.env] = "q8_0"
        if opt.field == "reasoning_format":
            env[opt.env] = "deepseek-legacy"
        if opt.field in ("max_body_bytes", "max_tokens_limit"):
            env[opt.env] = "100000"
        if opt.field == "kv_events_endpoint":
            env[opt.env] = "tcp://127.0.0.1:5557"
        if opt.field == "cors_allow_origin":
            env[opt.env] = "http://a.example, https://b.example:8443"
        if opt.field == "normalize":
            env[opt.env] = "claude-code"
        if opt.field in ("ssl_certfile", "ssl_keyfile"):
            env.update({"SLOTSERVE_SSL_CERTFILE": "c.pem", "SLOTSERVE_SSL_KEYFILE": "k.pem"})
        c = config_from_args(None, environ=env)
        value = getattr(c, opt.field)
        assert value == opt.parse(env[opt.env]), opt.field


def test_names_from_flags_and_env() -> None:
    assert parse(["--served-model-name", "a", "b"]).served_model_name == ("a", "b")
    assert parse([], {"SLOTSERVE_SERVED_MODEL_NAME": "x,y"}).served_model_name == ("x", "y")


@pytest.mark.parametrize(
    "env, fragment",
    [
        ({"SLOTSERVE_PORT": "eighty"}, "SLOTSERVE_PORT"),
        ({"SLOTSERVE_NO_REUSE": "maybe"}, "SLOTSERVE_NO_REUSE"),
        ({"SLOTSERVE_DRAIN_GRACE_S": "soon"}, "SLOTSERVE_DRAIN_GRACE_S"),
    ],
)
def test_bad_environment_value_fails_loudly(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        config_from_args(None, environ=env)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"port": 0}, "port"),
        ({"batched_session": 0}, "--batched-session"),
        ({"kv_disk_space_mb": 10}, "--kv-disk-dir"),
        ({"default_max_tokens": 50000}, "--default-max-tokens"),
        ({"default_max_tokens": 0}, "--default-max-tokens"),
        ({"log_level": "loud"}, "--log-level"),
        ({"api_key": ""}, "--api-key"),
        ({"kv_events_endpoint": "x"}, "--kv-events-endpoint"),
        ({"kv_events_endpoint": "http://127.0.0.1:5557"}, "--kv-events-endpoint"),
        ({"kv_events_endpoint": "tcp://127.0.0.1"}, "--kv-events-endpoint"),
        ({"ssl_certfile": "c.pem"}, "--ssl-keyfile"),
        ({"ssl_keyfile": "k.pem"}, "--ssl-certfile"),
        ({"header_timeout_s": 0}, "--header-timeout-s"),
        ({"body_timeout_s": -1}, "--body-timeout-s"),
        ({"keep_alive_timeout_s": 0}, "--keep-alive-timeout-s"),
        ({"max_connections": 0}, "--max-connections"),
        ({"prefill_order": "sjf"}, "--prefill-order"),
        ({"prefill_aging_tokens_per_s": 0}, "--prefill-aging-tokens-per-s"),
        (
            {"max_batch_tokens": 0},
            r"--max-batch-tokens must be in 1\.\.16384 \(rows of one engine step\), got 0",
        ),
        ({"max_batch_tokens": 16385}, "--max-batch-tokens must be in 1..16384"),
    ],
)
def test_out_of_range_values_name_the_flag(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        ServeConfig(**kwargs)


def test_prefill_order_reaches_the_scheduler_config() -> None:
    default = scheduler_config(parse([]))
    assert default.prefill_order is PrefillOrder.COST
    assert default.prefill_aging_tokens_per_s is None  # auto
    fifo = scheduler_config(
        parse(["--prefill-order", "fifo"], {"SLOTSERVE_PREFILL_AGING_TOKENS_PER_S": "64"})
    )
    assert fifo.prefill_order is PrefillOrder.FIFO
    assert fifo.prefill_aging_tokens_per_s == 64.0


def test_no_reuse_flag_and_env() -> None:
    assert parse(["--no-reuse"]).no_reuse is True
    assert parse([], {"SLOTSERVE_NO_REUSE": "1"}).no_reuse is True
    assert parse([], {"SLOTSERVE_NO_REUSE": "0"}).no_reuse is False


def test_no_decode_chain_flag_reaches_the_scheduler_config() -> None:
    assert scheduler_config(parse([])).decode_chain is True
    assert scheduler_config(parse(["--no-decode-chain"])).decode_chain is False
    assert scheduler_config(parse([], {"SLOTSERVE_NO_DECODE_CHAIN": "1"})).decode_chain is False


def test_cli_run_reports_bad_env_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from slotserve.cli import main

    monkeypatch.setenv("SLOTSERVE_MAX_QUEUE", "-3")
    assert main(["serve"]) == 2
    assert "--max-queue" in capsys.readouterr().err


def test_kv_events_endpoint_builds_the_publisher_config() -> None:
    c = parse(
        [
            "--kv-events-endpoint",
            "tcp://*:5557",
            "--kv-events-topic",
            "kv@x@m",
            "--kv-events-block-size",
            "32",
        ]
    )
    events = c.kv_events_config()
    assert events is not None
    assert (events.endpoint, events.topic, events.block_size, events.binds) == (
        "tcp://*:5557",
        "kv@x@m",
        32,
        True,
    )
    assert parse([]).kv_events_config() is None


@pytest.mark.parametrize("endpoint", ["x", "http://127.0.0.1:5557"])
def test_cli_rejects_a_malformed_kv_events_endpoint_before_loading(
    endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from slotserve.cli import main

    # NOTE: no model is given; a traceback from model loading would mean validation came too late.
    assert main(["serve", "--kv-events-endpoint", endpoint, "--model", "/nonexistent/model.gguf"]) == 2
    err = capsys.readouterr().err
    assert "slotserve serve:" in err and "--kv-events-endpoint" in err


def test_max_batch_tokens_from_flag_and_env_and_its_errors(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from slotserve.cli import main

    assert parse([]).max_batch_tokens is None  # the engine's default (512)
    assert parse(["--max-batch-tokens", "128"], {"SLOTSERVE_MAX_BATCH_TOKENS": "64"}).max_batch_tokens == 128
    assert parse([], {"SLOTSERVE_MAX_BATCH_TOKENS": "64"}).max_batch_tokens == 64
    with pytest.raises(ValueError, match="SLOTSERVE_MAX_BATCH_TOKENS"):
        parse([], {"SLOTSERVE_MAX_BATCH_TOKENS": "lots"})
    monkeypatch.setenv("SLOTSERVE_MAX_BATCH_TOKENS", "-1")
    assert main(["serve"]) == 2  # before any model is loaded
    assert "--max-batch-tokens must be in 1..16384" in capsys.readouterr().err


def test_max_batch_tokens_sizes_the_engine_step_and_the_rings(arch_model_factory) -> None:
    """The tiny gemma3 fixture (window 16): a ring keeps the window + max_batch_tokens - 1 rows
    rounded up to the attention chunk, so a smaller step shrinks the KV; full KV is unchanged."""
    from slotserve.gateway.runtime import open_served_model

    path = str(arch_model_factory("gemma3"))

    def opened(**kw):
        return open_served_model(ServeConfig(model=path, batched_session=1, ctx_size=1024, threads=1, **kw))

    default, small = opened().bundle.pool, opened(max_batch_tokens=16).bundle.pool
    assert (default.max_batch_tokens, small.max_batch_tokens) == (512, 16)
    assert small.ring_len < default.ring_len and small.kv_bytes < default.kv_bytes
    assert small.ring_len >= 16 + 16 - 1
    full = opened(max_batch_tokens=16, swa_full=True).bundle.pool
    assert full.ring_len == 0 and full.kv_bytes == opened(swa_full=True).bundle.pool.kv_bytes


def test_speculative_opens_a_recurrent_pool_with_a_rollback_ring(
    qwen35_model_factory, tiny_model_factory
) -> None:
    """--speculative ngram gives a recurrent model's pool --draft-max + 1 rollback states per
    slot (so its drafts can be cut back; their memory counted in kv_bytes), none when off; a
    model without recurrent state never gets one."""
    from slotserve.gateway.runtime import open_served_model

    def pool(path, **kw):
        config = ServeConfig(model=str(path), batched_session=2, ctx_size=256, threads=1, **kw)
        return open_served_model(config).bundle.pool

    qwen35 = qwen35_model_factory()
    off, on = pool(qwen35, speculative="off"), pool(qwen35, speculative="ngram", draft_max=4)
    assert (off.rollback, on.rollback) == (0, 5)
    assert on.kv_bytes - off.kv_bytes == 2 * 5 * on.state_bytes > 0
    assert pool(tiny_model_factory("Q8_0"), speculative="ngram").rollback == 0


def test_kv_type_opens_an_8_bit_pool_and_refuses_others(arch_model_factory, tiny_model_factory) -> None:
    """--kv-type q8_0: the pool's KV is 34/64 of f16's (tiny gemma3: head_dim 64); a model whose
    head_dim is not a multiple of 32 is refused at start with the reason; other names never parse."""
    from slotserve.engine_ext.errors import ModelOpenError
    from slotserve.gateway.runtime import open_served_model

    def opened(path, **kw):
        return open_served_model(
            ServeConfig(model=str(path), batched_session=1, ctx_size=256, threads=1, **kw)
        )

    path = arch_model_factory("gemma3")
    f16, q8 = opened(path).bundle.pool, opened(path, kv_type="q8_0").bundle.pool
    assert (f16.kv_dtype, q8.kv_dtype) == ("f16", "q8_0") and q8.kv_bytes * 64 == f16.kv_bytes * 34
    with pytest.raises(ModelOpenError, match="multiple of 32"):
        opened(tiny_model_factory("Q8_0"), kv_type="q8_0")  # head_dim 16
    with pytest.raises(ValueError, match="--kv-type must be one of f16, q8_0"):
        config_from_args(None, environ={"SLOTSERVE_KV_TYPE": "q4_0"})


def test_normalize_names_only_known_clients() -> None:
    assert config_from_args(None, environ={"SLOTSERVE_NORMALIZE": "claude-code"}).normalize == (
        "claude-code",
    )
    with pytest.raises(ValueError, match="--normalize: 'aider' is not one of claude-code"):
        config_from_args(None, environ={"SLOTSERVE_NORMALIZE": "aider"})


def test_serve_help_renders_every_option() -> None:
    """`slotserve serve --help` prints every flag (argparse %-formats help texts: a bare % in one,
    such as --kv-type's "53%", made --help raise)."""
    import argparse

    from slotserve.gateway.options import OPTIONS, add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    text = parser.format_help()
    assert all(opt.flags[0] in text for opt in OPTIONS) and "53%" in text
