"""Agent subsystem: serve the Prometheus exporter when the config asks for
one (`[metrics] listen`)."""

from __future__ import annotations

import logging

from ..errors import MrcError
from ..observe import exporter
from . import loop as agentmod

log = logging.getLogger("mrc.exporter")


@agentmod.subsystem
def _agent_exporter(agent: agentmod.Agent) -> None:
    listen = agent.cfg.metrics_listen
    if not listen:
        return
    collector = exporter.SnapshotCollector(agent.cfg)
    try:
        agent.exporter = exporter.serve(agent.cfg, listen, collector=collector)
        log.info("metrics on http://%s/metrics", listen)
        agent.on_peers(lambda cfg, _touched: collector.set_config(cfg))
    except MrcError as e:
        # probes and events matter more than metrics: keep the agent running
        log.error("metrics exporter disabled: %s", e)
