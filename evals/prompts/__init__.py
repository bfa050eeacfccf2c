"""Prompt rendering shared by tasks and engines: lm-eval's chat messages with the model's template
(chat), the think-tag split of reasoning models (reasoning).
"""
