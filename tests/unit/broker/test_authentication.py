"""The one authentication service: salted scrypt hashes, the password file, the anonymous
policy, the verified-password cache, and failed logins limited per address."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kittiwake.broker.authentication import (
    ANONYMOUS,
    Authentication,
    Credentials,
    PasswordFileError,
    PasswordHash,
    Principal,
    Refusal,
    format_password_file,
    parse_password_file,
)

# Cheap hashes for tests (the parameters travel with each hash; production uses 2**14).
FAST = 4


def users(**passwords: str) -> dict[str, PasswordHash]:
    return {name: PasswordHash.make(pw, log2_n=FAST) for name, pw in passwords.items()}


def test_a_hash_matches_its_password_only() -> None:
    hashed = PasswordHash.make("correct horse", log2_n=FAST)
    assert hashed.matches("correct horse")
    assert not hashed.matches("correct horse ")
    assert not hashed.matches("")


def test_the_same_password_hashes_differently_each_time() -> None:
    """Salted: equal passwords do not give equal hashes (no rainbow tables, no spotting)."""
    first, second = PasswordHash.make("pw", log2_n=FAST), PasswordHash.make("pw", log2_n=FAST)
    assert first.digest != second.digest


def test_default_cost_is_slow_scrypt() -> None:
    text = PasswordHash.make("pw").text()
    assert text.startswith("$scrypt$ln=14,r=8,p=1$")
    assert PasswordHash.parse(text).matches("pw")


@given(st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=30))
@settings(max_examples=25, deadline=None)
def test_file_text_round_trips(password: str) -> None:
    table = {"alice": PasswordHash.make(password, log2_n=FAST)}
    parsed = parse_password_file(format_password_file(table))
    assert parsed == table and parsed["alice"].matches(password)


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("alice", "line 1"),
        ("# users\n\nalice:$plain$x", "line 3"),
        ("alice:$scrypt$ln=14,r=8,p=1$!!$AAAA", "line 1"),
        ("alice:$scrypt$ln=99,r=8,p=1$AAAA$AAAA", "line 1"),
        (":$scrypt$ln=4,r=8,p=1$AAAA$AAAA", "line 1"),
    ],
)
def test_a_bad_line_is_named(text: str, where: str) -> None:
    with pytest.raises(PasswordFileError, match=where):
        parse_password_file(text)


def test_a_user_twice_is_refused() -> None:
    line = "alice:" + PasswordHash.make("x", log2_n=FAST).text()
    with pytest.raises(PasswordFileError, match="line 2: user 'alice' appears twice"):
        parse_password_file(f"{line}\n{line}\n")


def test_anonymous_is_allowed_while_no_users_exist() -> None:
    assert Authentication().check(Credentials()) is ANONYMOUS
    assert Authentication(users(alice="pw")).check(Credentials()) is Refusal.NOT_AUTHORIZED


def test_the_listener_policy_wins_then_the_broker_policy() -> None:
    closed = Authentication(allow_anonymous=False)
    assert closed.check(Credentials()) is Refusal.NOT_AUTHORIZED
    assert closed.check(Credentials(), listener_policy=True) is ANONYMOUS
    open_with_users = Authentication(users(alice="pw"), allow_anonymous=True)
    assert open_with_users.check(Credentials()) is ANONYMOUS
    assert open_with_users.check(Credentials(), listener_policy=False) is Refusal.NOT_AUTHORIZED


def test_without_users_a_user_name_is_taken_on_trust() -> None:
    """As before users existed: nothing to check the name against."""
    verdict = Authentication(allow_anonymous=False).check(Credentials("bob", "anything"))
    assert verdict == Principal("bob", False, "unchecked")


def test_a_password_is_checked_off_the_caller_then_remembered() -> None:
    auth = Authentication(users(alice="secret"))
    credentials = Credentials("alice", "secret", address="10.0.0.1")
    assert auth.check(credentials) is None  # needs the slow check
    assert auth.verify(credentials) == Principal("alice", True, "password")
    # A reconnect with the same password needs no scrypt; a different one does.
    assert auth.check(credentials) == Principal("alice", True, "password")
    assert auth.check(Credentials("alice", "other")) is None


@pytest.mark.parametrize(
    "credentials",
    [Credentials("alice", "wrong"), Credentials("mallory", "secret"), Credentials("alice", None)],
)
def test_bad_credentials(credentials: Credentials) -> None:
    assert Authentication(users(alice="secret")).verify(credentials) is Refusal.BAD_CREDENTIALS


def test_a_certificate_names_the_user_without_a_password() -> None:
    auth = Authentication(users(alice="secret"))
    assert auth.check(Credentials(certificate_name="CN=dev-7")) == Principal(
        "CN=dev-7", True, "certificate"
    )


def test_replaced_users_apply_to_the_next_login() -> None:
    auth = Authentication(users(alice="old"))
    assert isinstance(auth.verify(Credentials("alice", "old")), Principal)
    auth.replace_users(users(alice="new", bob="pw"))
    assert auth.verify(Credentials("alice", "old")) is Refusal.BAD_CREDENTIALS
    assert isinstance(auth.verify(Credentials("alice", "new")), Principal)
    assert isinstance(auth.verify(Credentials("bob", "pw")), Principal)


def test_failed_logins_are_limited_per_address_for_a_window() -> None:
    now = [0.0]
    auth = Authentication(
        users(alice="secret"), max_failed_logins=3, failure_window=60, clock=lambda: now[0]
    )
    for _ in range(3):
        assert auth.verify(Credentials("alice", "guess", address="10.0.0.9")) is (
            Refusal.BAD_CREDENTIALS
        )
    # Even the right password is refused from there now, unchecked; elsewhere it works.
    assert auth.verify(Credentials("alice", "secret", address="10.0.0.9")) is (
        Refusal.RATE_LIMITED
    )
    assert isinstance(auth.verify(Credentials("alice", "secret", address="10.0.0.8")), Principal)
    now[0] = 61.0
    assert isinstance(auth.verify(Credentials("alice", "secret", address="10.0.0.9")), Principal)
