"""bigbatch: very-large-batch synchronous data-parallel training with LARS."""

__version__ = "0.1.0"
