"""pdserve's planner: sizes the prefill and decode pools together from what replicas report."""
