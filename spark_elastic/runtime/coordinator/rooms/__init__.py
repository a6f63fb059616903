"""The supervisor's rooms: each step of the coordinator's state machine in a module of its own.

Owns: :mod:`.base` (the shared state and steps), :mod:`.planning` (plan
once, resume), :mod:`.registration` (leases: registration, heartbeats,
progress), :mod:`.failover` (expiry, failover, crash loops that fail the
job), :mod:`.changing` (scale, factor changes, the autoscaler's settings,
growth's turn) and :mod:`.stopping` (the stop sequence). Each is a mixin
of :class:`.base.SupervisorBase`; :class:`~..supervisor.Supervisor` is
them all together.

May import what :mod:`..supervisor` may; never :mod:`..supervisor` itself,
nor :mod:`..server`.
"""
