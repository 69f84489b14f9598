"""The fleet-level placement decision, shared by the broker and the fleet simulator.

Pure (no I/O, no event loop): the catalog of what every cluster's agent reported plus the broker's
reservations (`catalog`, with its numpy arrays in `arrays`), the per-cycle view a placement cycle
decides over (`view`), the decision itself (`decide`) and the cluster-choice policies behind one
interface (`choice`). The broker's placer drives it against live agents; the fleet simulator's fast
mode drives the very same code in virtual time.
"""
