"""The one exception type `quant` raises for bad user input (shown as a one-line CLI error)."""


class QuantError(ValueError):
    """Bad input to a quantizer, KV-cache spec, scales file or calibration: the message says what to do."""
