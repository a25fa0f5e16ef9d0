"""The launcher side: where workers start and stop (launcher, devices, heartbeat and stall, preemption, logs)."""
