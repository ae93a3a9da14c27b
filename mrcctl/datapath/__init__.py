"""The kernel side as Python sees it: the ABI mirror of bpf/mrc.h (abi), the
libbpf ctypes layer (libbpf), handles on a running instance's maps and
programs (maps) and loading the compiled objects (objects).

Nothing here knows about configs, namespaces or processes: this is the
bottom layer, and every other subpackage may import it.
"""
