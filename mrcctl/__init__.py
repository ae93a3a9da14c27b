"""mrc: the Multipath Reliable Connection path model in software, on eBPF."""

__version__ = "0.1.0"
