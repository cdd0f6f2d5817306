"""Ringmaster's Python package. `import ringmaster.torch as hvd` is Horovod's PyTorch API."""
__version__ = "0.1.0"
