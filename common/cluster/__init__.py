"""The plumbing between processes and nodes: Ray's start, stopping on signals, ports
and interfaces, actor placement, time-sharing a GPU, timeouts, Redis, process memory.

May import ``common/families`` and those below it."""
