"""`python -m evals.servers llamacpp ...`: the llama.cpp server child (evals.servers.llamacpp)."""

from evals.servers.llamacpp import main

if __name__ == "__main__":
    main()
