"""Tandem: speculative decoding for local LLMs."""

__version__ = "0.1.0"
