"""Integration tests: a real Kittiwake broker process on a loopback port, real clients."""
