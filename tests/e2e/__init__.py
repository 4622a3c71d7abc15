"""End-to-end tests against a real vLLM (``pytest -m vllm``)."""
