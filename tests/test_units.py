"""pyobmem.units: the one byte and duration formatter every verb, export and report uses."""

import pytest

from pyobmem.units import format_bytes, format_duration

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40


@pytest.mark.parametrize("n, digits, text", [
    (0, 1, "0 B"), (1023, 1, "1023 B"), (1023, 2, "1023 B"), (KiB, 1, "1.0 KiB"), (1536, 1, "1.5 KiB"),
    (1536, 2, "1.50 KiB"), (4 * MiB + 1, 1, "4.0 MiB"), (24 * MiB, 2, "24.00 MiB"), (int(1.5 * GiB), 2, "1.50 GiB"),
    (3 * TiB, 1, "3.0 TiB"), (2048 * TiB, 1, "2048.0 TiB"), (-2 * KiB, 1, "-2.0 KiB"), (None, 1, "-"),
])
def test_format_bytes(n, digits, text):
    assert format_bytes(n, digits=digits) == text


@pytest.mark.parametrize("ns, digits, text", [
    (0, 1, "0 ns"), (999, 3, "999 ns"), (1000, 1, "1.0 µs"), (100_000, 1, "100.0 µs"),
    (421_820, 3, "421.8 µs"),  # never finer than 100 ns
    (1_234_567, 1, "1.2 ms"), (595_216_000, 3, "595.216 ms"), (3_390_000_000, 1, "3.4 s"),
    (3_390_000_000, 2, "3.39 s"), (-5_000_000, 3, "-5.000 ms"), (None, 1, "-"),
])
def test_format_duration(ns, digits, text):
    assert format_duration(ns, digits=digits) == text


@pytest.mark.parametrize("ns, text", [(1000, "1 µs"), (2e6, "2 ms"), (5_623_413, "5.62 ms"), (17_782.8, "17.8 µs"),
                                      (421.0, "421 ns"), (1.5e9, "1.5 s")])
def test_format_duration_significant(ns, text):
    assert format_duration(ns, significant=3) == text
