"""The operator tooling: the ``pdserve`` CLI, launcher, Serve REST client, run state, status."""
