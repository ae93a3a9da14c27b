"""One instance: an overlay device in one network namespace, from its config
to what runs. config and topology read the world, state records what `up`
did, preflight/fill/slots/reconcile (with lock and supervisor) make the
kernel match the config, admin and events are what the operator and the
agent change and log while it runs."""
