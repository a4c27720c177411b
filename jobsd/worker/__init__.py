"""The daemon: claim, run, heartbeat, complete, sweep. ``supervisor.Daemon`` starts it all."""
