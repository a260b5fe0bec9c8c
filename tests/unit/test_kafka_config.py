"""Kafka URL parsing and client settings (no broker needed)."""

from __future__ import annotations

import re

import pytest

from harness.log.kafka.config import KafkaSettings, parse_kafka_url


def test_url_with_every_option() -> None:
    url = (
        "kafka://k1:9092,k2:9093?topic_prefix=acme&partitions=24&replication_factor=3"
        "&min_insync_replicas=2&registry_url=http://sr:8081"
    )
    assert parse_kafka_url(url) == {
        "bootstrap": "k1:9092,k2:9093",
        "topic_prefix": "acme",
        "partitions": 24,
        "replication_factor": 3,
        "min_insync_replicas": 2,
        "registry_url": "http://sr:8081",
    }
    assert parse_kafka_url("kafka://127.0.0.1:9092") == {"bootstrap": "127.0.0.1:9092"}


@pytest.mark.parametrize(
    "url",
    [
        "kafka://",
        "http://h:1",
        "kafka://h:1?nope=1",
        "kafka://h:1?partitions=x",
        "kafka://h:1/path",
        "kafka://h:1?partitions=",
    ],
)
def test_bad_urls_are_refused(url: str) -> None:
    with pytest.raises(ValueError):
        parse_kafka_url(url)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("kafka://127.0.0.1", "'127.0.0.1' needs a port: kafka://127.0.0.1:9092"),
        ("kafka://k1:9092,k2", "'k2' needs a port: kafka://k2:9092"),
        ("kafka://k1:99999", "'99999' is not a port (1-65535) in 'k1:99999'"),
        ("kafka://k1:port", "'port' is not a port"),
    ],
)
def test_a_server_without_a_usable_port_says_what_to_write(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        parse_kafka_url(url)
    assert parse_kafka_url("kafka://[::1]:9092") == {"bootstrap": "[::1]:9092"}


def test_credentials_in_the_url_are_refused_without_being_echoed() -> None:
    with pytest.raises(ValueError) as refused:
        parse_kafka_url("kafka://alice:hunter2@k1:9092?topic_prefix=a")
    assert "hunter2" not in str(refused.value) and "HARNESS_KAFKA_CONFIG_SASL_PASSWORD" in str(refused.value)


def test_client_config_is_copied_and_guarded() -> None:
    given = {"security.protocol": "SASL_SSL"}
    settings = KafkaSettings(bootstrap="h:1", client_config=given)
    given["security.protocol"] = "PLAINTEXT"
    assert settings.owner_producer_config(3)["security.protocol"] == "SASL_SSL"
    assert settings.owner_producer_config(3)["transactional.id"] == "harness.owner.3"
    with pytest.raises(ValueError, match=r"transactional\.id"):
        KafkaSettings(bootstrap="h:1", client_config={"transactional.id": "mine"})
    with pytest.raises(ValueError, match=r"isolation\.level"):
        KafkaSettings(bootstrap="h:1", client_config={"isolation.level": "read_uncommitted"})


def test_settings_validate_names_and_counts() -> None:
    with pytest.raises(ValueError):
        KafkaSettings(bootstrap="h:1", topic_prefix="bad prefix")
    with pytest.raises(ValueError):
        KafkaSettings(bootstrap="h:1", partitions=0)
    with pytest.raises(ValueError):
        KafkaSettings(bootstrap="h:1", replication_factor=1, min_insync_replicas=2)
    settings = KafkaSettings(bootstrap="h:1", topic_prefix="acme")
    assert (settings.sessions_topic, settings.dead_letter_topic) == ("acme.sessions", "acme.dead-letter")
    assert settings.reader_config()["isolation.level"] == "read_committed"


@pytest.mark.parametrize(
    "url",
    [
        "sqlite://x.db",  # two slashes
        "postgres://db/harness",  # no such log
        "kafka://broker",  # no port
        "kafka://broker:9092?bogus=1",  # no such option
        "kafka://broker:9092?partitions=0",  # a count out of range (KafkaSettings)
        "sqlite:///x.db?max_record_bytes=-1",
    ],
)
def test_a_wrong_log_url_is_a_harness_error_and_still_a_value_error(url: str, tmp_path: object) -> None:
    # An app that catches the library's one root (HarnessError) catches a wrong URL too
    # (it came from the environment: HARNESS_LOG); ValueError as before.
    from harness import open_log
    from harness.errors import ConfigError, HarnessError, LogConfigError

    with pytest.raises(LogConfigError) as caught:
        open_log(url)
    assert isinstance(caught.value, HarnessError) and isinstance(caught.value, ConfigError)
    assert isinstance(caught.value, ValueError)
    assert "\n" not in str(caught.value)


def test_a_broker_that_does_not_answer_points_at_the_security_protocol() -> None:
    """`HARNESS_KAFKA_CONFIG_SECURITY_PROTOCOL=SSL` against a plaintext listener (or the
    reverse) said only "cannot reach Kafka ... check the address and that the broker is up";
    the line now names the protocol to check (never a credential)."""
    import socket

    from harness.errors import LogUnavailable
    from harness.log.kafka.topics import probe

    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    tls = KafkaSettings(bootstrap=f"127.0.0.1:{port}", client_config={
        "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": "hunter2"})
    with pytest.raises(LogUnavailable) as refused:
        probe(tls, timeout=0.5)
    message = str(refused.value)
    assert message.endswith("that its listener at that address speaks security.protocol 'SASL_SSL', as this client does")
    assert "hunter2" not in message and "\n" not in message
    with pytest.raises(LogUnavailable) as plain:
        probe(KafkaSettings(bootstrap=f"127.0.0.1:{port}"), timeout=0.5)
    assert "set security.protocol: HARNESS_KAFKA_CONFIG_SECURITY_PROTOCOL" in str(plain.value)
