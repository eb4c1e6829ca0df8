"""specgate's engine: a small async speculative-decoding engine for Llama-architecture models."""
from engine.llm import LLM
from engine.outputs import RequestOutput
from engine.sampling import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput"]
