"""Lowering: expanded CAKE IR -> readable CUDA C++ with a line -> node map."""
from .emit import Lowered, header_text, lower

__all__ = ["Lowered", "lower", "header_text"]
