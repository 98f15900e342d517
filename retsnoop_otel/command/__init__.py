"""What every command of the tool shares, below all the layers that trace: its exit codes and the refusals that map
to them, its event log, and the layout of its --help. Nothing here knows about tracing."""
