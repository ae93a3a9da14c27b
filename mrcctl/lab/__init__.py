"""Throwaway hosts to run mrc on: the namespace testbed, the demo built on
it and the demo's TCP stream. Used by the CLI, the tests and scripts/;
nothing in the product imports it."""
