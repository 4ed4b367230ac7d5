"""Error messages never show the password of a URL, whoever wrote the message."""

from __future__ import annotations

from click.testing import CliRunner

from cachekit import CachedDataset, CacheError
from cachekit.cli import main
from cachekit.errors import hide_userinfo


def test_passwords_in_urls_are_hidden_with_or_without_a_scheme():
    assert hide_userinfo("s3://user:SECRET@bucket/x") == "s3://user:***@bucket/x"
    assert (
        hide_userinfo('Invalid bucket name "user:SECRET@datasets"')
        == 'Invalid bucket name "user:***@datasets"'
    )
    assert hide_userinfo("sample 3: 5@x is fine") == "sample 3: 5@x is fine"
    assert "SECRET" not in str(CacheError("cannot read http://u:SECRET@127.0.0.1:1/cache"))


def test_a_url_with_a_password_never_reaches_the_screen(tmp_path):
    result = CliRunner().invoke(main, ["info", "http://user:SECRET@127.0.0.1:1/cache"])
    assert result.exit_code != 0 and "SECRET" not in result.output
    try:
        CachedDataset("http://user:SECRET@127.0.0.1:1/cache")
    except Exception as exc:  # noqa: BLE001 -- whatever it is, it must not show the password
        assert "SECRET" not in str(exc)
