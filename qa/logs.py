"""Logging set-up shared by the CLI and the arm processes."""

import logging

# Optional packages that transformers imports when present (torchao from the dev extra) log
# start-up noise about kernels this CPU build cannot use; it says nothing about the run.
NOISY_LOGGERS = ("torchao", "torch.utils._pytree", "torch._dynamo")


def quiet_third_party_logs() -> None:
    """Raise known-noisy third-party loggers to ERROR."""
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
