"""The broker's API edge: the gRPC servers and servicers, the plain handlers behind them (shared with
the fleet view), protobuf <-> domain translation and the validation of everything a caller sends.

The only room that speaks protobuf on the hub's side.
"""
