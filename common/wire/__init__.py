"""What crosses a process boundary and how: the named messages, trajectories, published
weights and their checks, tensors shared through Ray's object store, the weight
broadcast group and the in-device handoff.

May import every other part of common/ (it is the top of common/'s layers)."""
