"""The user name a verified client certificate proves (Python's ssl gives the subject as
nested tuples of long attribute names)."""

from __future__ import annotations

from kittiwake.tls import certificate_user

CERT = {
    "subject": (
        (("countryName", "DE"),),
        (("organizationName", "Example, Inc."),),
        (("commonName", "alice"),),
    )
}


def test_common_name() -> None:
    assert certificate_user(CERT, "cn") == "alice"


def test_subject_as_rfc_4514_text_most_specific_first_and_escaped() -> None:
    assert certificate_user(CERT, "subject") == "CN=alice,O=Example\\, Inc.,C=DE"


def test_no_certificate_or_no_mapping_names_no_one() -> None:
    assert certificate_user(None, "cn") is None
    assert certificate_user({}, "cn") is None  # CERT_NONE: the dict is empty
    assert certificate_user(CERT, "none") is None
    assert certificate_user({"subject": ((("organizationName", "X"),),)}, "cn") is None


def test_leading_and_trailing_specials_are_escaped() -> None:
    cert = {"subject": ((("commonName", "#admin "),),)}
    assert certificate_user(cert, "subject") == "CN=\\#admin\\ "
