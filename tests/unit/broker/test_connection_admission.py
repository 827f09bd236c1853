"""Connection admission per client address: open connections and arrival rate, bounded memory."""

from __future__ import annotations

from kittiwake.broker.connection_admission import AdmissionRefusal, ConnectionAdmission
from kittiwake.clock import ManualClock
from kittiwake.config import LimitsConfig


def test_no_limits_admit_everyone() -> None:
    admission = ConnectionAdmission(LimitsConfig(), ManualClock())
    assert all(admission.admit("10.0.0.1") is None for _ in range(10_000))


def test_open_connections_per_address_are_bounded_and_freed_on_release() -> None:
    admission = ConnectionAdmission(LimitsConfig(max_connections_per_address=2), ManualClock())
    assert admission.admit("a") is None
    assert admission.admit("a") is None
    assert admission.admit("a") is AdmissionRefusal.QUOTA
    assert admission.admit("b") is None, "another address has its own count"
    admission.release("a")
    assert admission.admit("a") is None
    for _ in range(2):
        admission.release("a")
    admission.release("b")
    assert admission.open_from("a") == admission.open_from("b") == 0


def test_arrivals_per_second_are_bounded_with_a_one_second_burst() -> None:
    clock = ManualClock()
    admission = ConnectionAdmission(LimitsConfig(max_connection_rate=5), clock)
    assert [admission.admit("a") for _ in range(6)] == [None] * 5 + [AdmissionRefusal.RATE]
    assert admission.admit("b") is None
    clock.advance(0.2)  # one more token
    assert admission.admit("a") is None
    assert admission.admit("a") is AdmissionRefusal.RATE
    clock.advance(10)
    assert [admission.admit("a") for _ in range(6)] == [None] * 5 + [AdmissionRefusal.RATE]


def test_a_refused_arrival_is_not_counted_open() -> None:
    clock = ManualClock()
    admission = ConnectionAdmission(
        LimitsConfig(max_connection_rate=1, max_connections_per_address=1), clock
    )
    assert admission.admit("a") is None
    assert admission.admit("a") is AdmissionRefusal.RATE
    clock.advance(5)
    assert admission.admit("a") is AdmissionRefusal.QUOTA
    assert admission.open_from("a") == 1


def test_quiet_addresses_are_forgotten() -> None:
    clock = ManualClock()
    admission = ConnectionAdmission(LimitsConfig(max_connection_rate=10), clock)
    for n in range(20_000):
        admission.admit(f"10.{n // 65536}.{n // 256 % 256}.{n % 256}")
        if n % 1000 == 999:
            clock.advance(2)
    assert len(admission._buckets) <= 5000
