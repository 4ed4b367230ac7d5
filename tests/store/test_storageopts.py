"""--storage-option parsing, and secrets kept out of messages and records."""

from __future__ import annotations

import pytest

from cachekit import BuildError, UsageError
from cachekit.store.storageopts import (
    command_line,
    parse_storage_options,
    redact,
    redact_pairs,
    secrets_hidden,
)


def test_values_are_typed_and_dotted_keys_nest():
    options = parse_storage_options(
        [
            "endpoint_url=http://127.0.0.1:9000",
            "anon=False",
            "default_block_size=8388608",
            "config_kwargs.connect_timeout=2.5",
            "config_kwargs.retries.max_attempts=3",
            "client_kwargs.region_name=eu-west-1",
            "session_token=0123",  # digits with a leading zero stay text
            'key="4711"',  # quoted: text
            's3_additional_kwargs={"ServerSideEncryption": "AES256"}',
            "requester_pays=null",
            "secret=a=b c",  # only the first '=' splits
        ]
    )
    assert options == {
        "endpoint_url": "http://127.0.0.1:9000",
        "anon": False,
        "default_block_size": 8388608,
        "config_kwargs": {"connect_timeout": 2.5, "retries": {"max_attempts": 3}},
        "client_kwargs": {"region_name": "eu-west-1"},
        "session_token": "0123",
        "key": "4711",
        "s3_additional_kwargs": {"ServerSideEncryption": "AES256"},
        "requester_pays": None,
        "secret": "a=b c",
    }
    assert parse_storage_options([]) == parse_storage_options(None) == {}


def test_secret_values_are_hidden_wherever_they_appear():
    options = {
        "endpoint_url": "http://minio:9000",
        "key": "AKIDEXAMPLE",
        "secret": "wJalrXUtnFEMI",
        "client_kwargs": {"aws_session_token": "tok-123456"},
        "anon": False,
    }
    text = "AKIDEXAMPLE/wJalrXUtnFEMI tok-123456 at http://minio:9000 and https://bob:hunter2@host/x"
    assert redact(text, options) == "***/*** *** at http://minio:9000 and https://bob:***@host/x"
    assert redact_pairs("got s3cr3t-typed-alone", ["s3cr3t-typed-alone"]) == "got ***"
    with pytest.raises(BuildError) as caught, secrets_hidden(options):
        raise BuildError("upload refused: wJalrXUtnFEMI")
    assert str(caught.value) == "upload refused: ***" and isinstance(caught.value, BuildError)


def test_the_recorded_command_line_never_holds_a_value():
    argv = [
        "bench",
        "raw",
        "s3://b/c",
        "--storage-option",
        "secret=xyz",
        "--storage-option=key=abc",
        "--quiet",
    ]
    assert command_line(argv) == (
        "cachekit bench raw s3://b/c --storage-option secret=*** --storage-option=key=*** --quiet"
    )


@pytest.mark.parametrize(
    "pair", ["Zq9SeCrEt", "=Zq9SeCrEt", "a b=Zq9SeCrEt", ".a=Zq9SeCrEt", "a.=Zq9SeCrEt", "x={Zq9SeCrEt"]
)
def test_malformed_pairs_are_usage_errors_that_never_show_the_text(pair):
    with pytest.raises(UsageError, match="--storage-option") as caught:
        parse_storage_options(["anon=true", pair])
    assert "Zq9SeCrEt" not in str(caught.value)


def test_credentials_names_and_endpoints_stay_text_whatever_they_look_like():
    options = parse_storage_options(
        ["key=1", "secret=true", "token=null", "client_kwargs.aws_access_key_id=42", "profile=7", 'key2="x"']
    )
    assert options == {
        "key": "1",
        "secret": "true",
        "token": "null",
        "client_kwargs": {"aws_access_key_id": "42"},
        "profile": "7",
        "key2": "x",
    }
    assert parse_storage_options(['key="4711"']) == {"key": "4711"}  # a quoted string is its text


@pytest.mark.parametrize(
    "endpoint", ["file:///etc", "ftp://host", "127.0.0.1:9000", "http://", "http://[::1", 9000, ["http://a"]]
)
def test_an_endpoint_that_is_not_an_http_url_is_a_usage_error(endpoint, tmp_path):
    from cachekit.store.remote import filesystem

    with pytest.raises(UsageError, match="endpoint_url must be an http"):
        filesystem("s3://bucket/cache", {"endpoint_url": endpoint})
    with pytest.raises(UsageError, match="endpoint_url must be an http"):
        filesystem("s3://bucket/cache", {"client_kwargs": {"endpoint_url": endpoint}})
