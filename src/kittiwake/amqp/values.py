"""The broker's name for :mod:`kittiwake.amqp_values` (the decoder moved there so that
kittiwake.jms, which imports no broker module, shares it)."""

from kittiwake.amqp_values import (
    MAX_DEPTH,
    Unsupported,
    decode,
    decode_described,
    decode_fields,
    sized_end,
)

__all__ = ["MAX_DEPTH", "Unsupported", "decode", "decode_described", "decode_fields", "sized_end"]
