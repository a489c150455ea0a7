"""Speculative decoding: proposers, verification, the controller, the compatibility check."""
