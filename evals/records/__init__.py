"""What an arm leaves on disk: SampleRecord JSONL (samples), arm.json (arm_file), fingerprints, env.json
(env), and the import of lm-eval samples and Inspect AI logs.
"""
