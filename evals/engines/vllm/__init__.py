"""vLLM: its engine arguments (args), the offline engine (offline), what a loaded engine reports
(introspect), the interpreter check (check), and the qa_kv plugin that emulates KV formats inside vLLM (kv/).
"""
