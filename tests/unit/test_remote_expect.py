"""S3 PUTs of small bodies send them at once: no `Expect: 100-continue` round trip (storage/remote.py)."""

import io

from botocore.awsrequest import AWSRequest  # (the test extra brings s3fs and botocore)

from zarrfs.storage import remote


def _put(nbytes: int) -> AWSRequest:
    return AWSRequest(
        method="PUT", url="http://127.0.0.1/b/k", headers={"Expect": "100-continue"}, data=io.BytesIO(b"\0" * nbytes)
    )


def test_small_put_loses_expect_and_large_keeps_it():
    small, large = _put(remote.EXPECT_CONTINUE_MIN_BYTES - 1), _put(remote.EXPECT_CONTINUE_MIN_BYTES)
    remote._body_at_once(small)
    remote._body_at_once(large)
    assert "Expect" not in small.headers
    assert large.headers["Expect"] == "100-continue"


def test_s3_options_carry_the_session_and_what_botocore_takes():
    options = remote.bounded_storage_options("s3://b/x", {"profile": "someone", "anon": True}, 30.0)
    session = options["session"]
    assert session.get_config_variable("profile") == "someone"  # as s3fs would have made it
    assert options["anon"] is True  # s3fs's own options stay s3fs's
    assert remote.bounded_storage_options("s3://b/x", {"session": "given"}, 30.0)["session"] == "given"
    assert "session" not in remote.bounded_storage_options("https://h/x", {}, 30.0)
