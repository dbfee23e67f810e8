"""pyobmem: application-oblivious GPU memory tracer and swap scheduler for DNN training."""

__version__ = "0.1.0"
