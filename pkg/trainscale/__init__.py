"""trainscale: predict and explain how distributed training of large models scales."""

__version__ = "0.1.0"
