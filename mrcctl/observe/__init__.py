"""Reading a running instance for people and programs: the snapshot (what
`status --json` prints), its sources, the terminal renderings (status, top)
and the Prometheus exporter. Reads maps and files; changes nothing."""
