"""The agent: the one long-running process of an instance (probes, link and
EV events, neighbour MACs, adaptive weights, metrics).

loop holds the task loop and the subsystem registry; every other module is a
subsystem that registers itself when loop.build() imports it. Nothing
outside mrcctl.cli imports this package: `up` starts the agent as a process
(instance.supervisor), by module name.
"""
