"""The scheduling loop: queue order and quota admission, fair share, the placer's decisions over a
fleet view, fleet-wide preemption and held domains.

Reads the store through its interface and tells the cluster side what to do through domain events;
never imports the API edge, the cluster link or protobuf.
"""
