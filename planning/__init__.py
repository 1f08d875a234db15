"""Memory planning: each actor's estimated peak device memory for a run's config,
computed from the architecture alone (no weights), with remedies for misfits."""
