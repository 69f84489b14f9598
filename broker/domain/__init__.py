"""The job model, pure: states and the transition table, the records the store keeps, the lifecycle's
reactions to events, what the placer and dispatcher tell each other, and the one error hierarchy.

Imports nothing else of the broker and does no I/O; every other room builds on it.
"""
